package memory

import (
	"context"
	"errors"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
)

// Semaphores and read/write locks: each kind is a namespace of its own,
// beside the locks map.

type semaphore struct {
	limit   int
	holders map[string]*entry // by token
}

type rwlock struct {
	writer     *entry
	readers    map[string]*entry    // by token
	writeWaits map[string]time.Time // waiting writers (Request.Wait) until when
}

// watchKey is the watchers' key of kind's object of name: the name itself
// for a lock, which no other kind's key can equal (names hold no NUL).
func watchKey(k dlockdriver.Kind, name string) string {
	if k == dlockdriver.KindLock {
		return name
	}
	if k == dlockdriver.KindWrite {
		k = dlockdriver.KindRead // one object, one set of watchers
	}
	return "\x00" + k.String() + "\x00" + name
}

// notify wakes the watchers of key; s.mu held.
func (s *Store) notify(key string) {
	for c := range s.watchers[key] {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// sem returns name's semaphore with its expired holders dropped, nil if it
// has none left; s.mu held.
func (s *Store) sem(name string, now time.Time) *semaphore {
	sm := s.sems[name]
	if sm == nil {
		return nil
	}
	for tok, e := range sm.holders {
		if !now.Before(e.expires) {
			delete(sm.holders, tok)
		}
	}
	if len(sm.holders) == 0 {
		delete(s.sems, name)
		return nil
	}
	return sm
}

// rw returns name's read/write lock with its expired holders and writers'
// waits dropped, nil if nothing is left; s.mu held.
func (s *Store) rw(name string, now time.Time) *rwlock {
	r := s.rws[name]
	if r == nil {
		return nil
	}
	if r.writer != nil && !now.Before(r.writer.expires) {
		r.writer = nil
	}
	for tok, e := range r.readers {
		if !now.Before(e.expires) {
			delete(r.readers, tok)
		}
	}
	for w, until := range r.writeWaits {
		if !now.Before(until) {
			delete(r.writeWaits, w)
		}
	}
	if r.writer == nil && len(r.readers) == 0 && len(r.writeWaits) == 0 {
		delete(s.rws, name)
		return nil
	}
	return r
}

// tryKind is TryAcquire for a permit or a side of a read/write lock; s.mu
// held. It returns the grant's fence (0 for a reader).
func (s *Store) tryKind(req dlockdriver.Request, now time.Time) (uint64, error) {
	e := &entry{token: req.Token, expires: now.Add(req.TTL), metadata: req.Metadata, since: now}
	switch req.Kind {
	case dlockdriver.KindPermit:
		sm := s.sem(req.Name, now)
		if sm == nil {
			sm = &semaphore{limit: req.Limit, holders: map[string]*entry{}}
			s.sems[req.Name] = sm
		}
		if sm.limit != req.Limit {
			return 0, dlockdriver.LimitMismatch(req.Name, req.Limit, sm.limit)
		}
		if len(sm.holders) >= sm.limit {
			return 0, dlockdriver.Busy(soonest(sm.holders, now))
		}
		s.fence++
		e.fence = s.fence
		sm.holders[req.Token] = e
		return e.fence, nil
	case dlockdriver.KindRead, dlockdriver.KindWrite:
		r := s.rw(req.Name, now)
		if r == nil {
			r = &rwlock{readers: map[string]*entry{}, writeWaits: map[string]time.Time{}}
			s.rws[req.Name] = r
		}
		if req.Kind == dlockdriver.KindRead {
			if r.writer != nil {
				return 0, dlockdriver.Busy(r.writer.expires.Sub(now))
			}
			if len(r.writeWaits) > 0 {
				var until time.Time
				for _, u := range r.writeWaits {
					if u.After(until) {
						until = u
					}
				}
				return 0, dlockdriver.Busy(until.Sub(now))
			}
			r.readers[req.Token] = e
			return 0, nil
		}
		if r.writer != nil || len(r.readers) > 0 {
			retry := soonest(r.readers, now)
			if r.writer != nil {
				retry = r.writer.expires.Sub(now)
			}
			if req.Wait != "" {
				// Keep new readers out until this writer's next attempt
				// (at the latest when what blocks it expires) and a TTL more.
				r.writeWaits[req.Wait] = now.Add(retry + req.TTL)
			}
			return 0, dlockdriver.Busy(retry)
		}
		delete(r.writeWaits, req.Wait)
		s.fence++
		e.fence = s.fence
		r.writer = e
		return e.fence, nil
	}
	return 0, errors.New("memory: unknown request kind " + req.Kind.String())
}

// soonest is when the first of holders expires.
func soonest(holders map[string]*entry, now time.Time) time.Duration {
	var first time.Time
	for _, e := range holders {
		if first.IsZero() || e.expires.Before(first) {
			first = e.expires
		}
	}
	return first.Sub(now)
}

// mineKind returns h's entry of a permit or read/write lock if it is still
// h's; s.mu held.
func (h *handle) mineKind(now time.Time) *entry {
	s := h.d.s
	switch h.kind {
	case dlockdriver.KindPermit:
		if sm := s.sem(h.name, now); sm != nil {
			return sm.holders[h.token]
		}
	case dlockdriver.KindRead:
		if r := s.rw(h.name, now); r != nil {
			return r.readers[h.token]
		}
	case dlockdriver.KindWrite:
		if r := s.rw(h.name, now); r != nil && r.writer != nil && r.writer.token == h.token {
			return r.writer
		}
	}
	return nil
}

// releaseKind removes h's permit or read/write hold; s.mu held, h's entry
// live.
func (h *handle) releaseKind(now time.Time) {
	s := h.d.s
	switch h.kind {
	case dlockdriver.KindPermit:
		delete(s.sems[h.name].holders, h.token)
		s.sem(h.name, now)
	case dlockdriver.KindRead:
		delete(s.rws[h.name].readers, h.token)
		s.rw(h.name, now)
	case dlockdriver.KindWrite:
		s.rws[h.name].writer = nil
		s.rw(h.name, now)
	}
	s.notify(watchKey(h.kind, h.name))
}

// WatchWait watches req's object (dlockdriver.WaitNotifier); the store
// queues nobody, so queued is false.
func (d *driver) WatchWait(ctx context.Context, req dlockdriver.Request) (<-chan struct{}, bool, error) {
	c, stop, err := d.watchKey(watchKey(req.Kind, req.Name))
	if err != nil {
		return nil, false, err
	}
	d.s.mu.Lock()
	if d.waitStops == nil {
		d.waitStops = map[string]func(){}
	}
	d.waitStops[req.Wait] = stop
	d.s.mu.Unlock()
	return c, false, nil
}

// EndWait stops req's watch and drops a writer's wait, waking the readers
// it kept out.
func (d *driver) EndWait(req dlockdriver.Request) {
	s := d.s
	s.mu.Lock()
	stop := d.waitStops[req.Wait]
	delete(d.waitStops, req.Wait)
	if req.Kind == dlockdriver.KindWrite {
		if r := s.rws[req.Name]; r != nil {
			if _, ok := r.writeWaits[req.Wait]; ok {
				delete(r.writeWaits, req.Wait)
				s.rw(req.Name, time.Now())
				s.notify(watchKey(req.Kind, req.Name))
			}
		}
	}
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Residue lists what the store keeps for name in any namespace: a lock, a
// semaphore's holders, a read/write lock's holders or writers' waits, and
// watchers. Tests use it to check that nothing is left behind.
func (s *Store) Residue(name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []string
	if e := s.live(name, now); e != nil {
		out = append(out, "lock held by "+e.token)
	}
	if sm := s.sem(name, now); sm != nil {
		out = append(out, "semaphore permits held")
	}
	if r := s.rw(name, now); r != nil {
		out = append(out, "read/write lock held or waited for")
	}
	for _, k := range []dlockdriver.Kind{dlockdriver.KindLock, dlockdriver.KindPermit, dlockdriver.KindRead} {
		if len(s.watchers[watchKey(k, name)]) > 0 {
			out = append(out, k.String()+" watchers")
		}
	}
	return out
}

var _ dlockdriver.WaitNotifier = (*driver)(nil)
