package memory

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
)

func init() {
	dlockdriver.Register("mem", func(ctx context.Context, u *url.URL) (dlockdriver.Driver, error) {
		s, opts, err := ParseURL(u)
		if err != nil {
			return nil, err
		}
		return newDriver(s, opts), nil
	})
}

// ParseURL returns the Store a mem:// URL names and the Options it sets.
// Every error matches dlock.ErrInvalid.
func ParseURL(u *url.URL) (*Store, *Options, error) {
	if u.Scheme != "mem" {
		return nil, nil, fmt.Errorf("%w: memory: scheme %q is not mem", dlock.ErrInvalid, u.Scheme)
	}
	q := u.Query()
	defaults, err := dlock.OptionsFromQuery(q)
	if err != nil {
		return nil, nil, err
	}
	if err := dlockdriver.RejectUnknown(q); err != nil {
		return nil, nil, err
	}
	if u.Path != "" && u.Path != "/" || u.User != nil {
		return nil, nil, fmt.Errorf("%w: mem URLs take only a store name as host, as in mem://NAME", dlock.ErrInvalid)
	}
	return NamedStore(u.Host), &Options{Defaults: *defaults}, nil
}

var (
	storesMu sync.Mutex
	stores   = map[string]*Store{}
)

// NamedStore returns the process-wide Store of that name ("" is the default
// one), creating it on first use.
func NamedStore(name string) *Store {
	storesMu.Lock()
	defer storesMu.Unlock()
	s := stores[name]
	if s == nil {
		s = NewStore()
		stores[name] = s
	}
	return s
}

// Store is the simulated lock server. Its zero value is not usable; call
// NewStore.
type Store struct {
	mu       sync.Mutex
	locks    map[string]*entry
	fence    uint64
	watchers map[string]map[chan struct{}]struct{}
	sems     map[string]*semaphore
	rws      map[string]*rwlock
	records  map[string]record // by lock name, made on first use (record.go)
}

type entry struct {
	token    string
	expires  time.Time
	fence    uint64
	metadata string
	since    time.Time
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{locks: map[string]*entry{}, watchers: map[string]map[chan struct{}]struct{}{},
		sems: map[string]*semaphore{}, rws: map[string]*rwlock{}}
}

// Len reports how many unexpired locks the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	now := time.Now()
	for _, e := range s.locks {
		if now.Before(e.expires) {
			n++
		}
	}
	return n
}

// Holder returns the token and metadata of the current holder of name.
func (s *Store) Holder(name string) (token, metadata string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.live(name, time.Now()); e != nil {
		return e.token, e.metadata, true
	}
	return "", "", false
}

// live returns the unexpired entry for name, dropping an expired one; s.mu held.
func (s *Store) live(name string, now time.Time) *entry {
	e := s.locks[name]
	if e != nil && !now.Before(e.expires) {
		delete(s.locks, name)
		return nil
	}
	return e
}

// Options configure a Locker on a Store.
type Options struct {
	// Defaults are the Locker's default lock options (URL: ttl, refresh,
	// refresh_interval, retry_min, retry_max, metadata). Zero fields mean the
	// defaults documented on dlock.Options.
	Defaults dlock.Options

	// Link, when not nil, carries every request of the Locker, so that tests
	// can partition, reset or slow it. Default: a perfect link.
	Link *Link
}

// New returns a Locker on s (nil: the default store).
func New(s *Store, opts *Options) (*dlock.Locker, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	return dlock.New(newDriver(s, &o), &o.Defaults)
}

func newDriver(s *Store, o *Options) *driver {
	if s == nil {
		s = NamedStore("")
	}
	link := o.Link
	if link == nil {
		link = NewLink()
	}
	return &driver{s: s, link: link}
}

type driver struct {
	s         *Store
	link      *Link
	waitStops map[string]func() // WatchWait's watches by Request.Wait; s.mu
}

// MinTTL is the shortest TTL the driver accepts. The store itself could
// keep shorter locks, but a grant is valid for the TTL minus dlock's drift
// margin (TTL/100 + 2ms): at 10ms that leaves 7.9ms for the grant to reach
// its Locker, while a TTL of 2ms or less could never be granted at all.
const MinTTL = 10 * time.Millisecond

func (d *driver) Capabilities() dlock.Capabilities {
	return dlock.Capabilities{Fencing: true, NotifiedWait: true, MinTTL: MinTTL,
		Metadata: true, Semaphore: true, PermitFencing: true, RWLock: true, Steal: true, Records: true}
}

func (d *driver) Close() error { return nil }

func (d *driver) TryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	var fence uint64
	err := d.link.Do(ctx, func() error {
		s := d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		if req.Kind != dlockdriver.KindLock {
			var err error
			fence, err = s.tryKind(req, now)
			return err
		}
		if e := s.live(req.Name, now); e != nil {
			return dlockdriver.Busy(e.expires.Sub(now))
		}
		s.fence++
		fence = s.fence
		s.locks[req.Name] = &entry{token: req.Token, expires: now.Add(req.TTL), fence: fence, metadata: req.Metadata, since: now}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &dlockdriver.Grant{Handle: &handle{d: d, name: req.Name, token: req.Token, kind: req.Kind}, Fence: fence}, nil
}

func (d *driver) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	return d.watchKey(name)
}

func (d *driver) watchKey(name string) (<-chan struct{}, func(), error) {
	c := make(chan struct{}, 1)
	s := d.s
	s.mu.Lock()
	if s.watchers[name] == nil {
		s.watchers[name] = map[chan struct{}]struct{}{}
	}
	s.watchers[name][c] = struct{}{}
	s.mu.Unlock()
	var once sync.Once
	return c, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.watchers[name], c)
			if len(s.watchers[name]) == 0 {
				delete(s.watchers, name)
			}
		})
	}, nil
}

type handle struct {
	d     *driver
	name  string
	token string
	kind  dlockdriver.Kind
}

// mine returns the entry if it is still this handle's; s.mu held.
func (h *handle) mine(now time.Time) *entry {
	if h.kind != dlockdriver.KindLock {
		return h.mineKind(now)
	}
	if e := h.d.s.live(h.name, now); e != nil && e.token == h.token {
		return e
	}
	return nil
}

// notMine is the error of an operation that found the lock not the
// handle's: ErrTakenOver when another owner holds it; s.mu held.
func (h *handle) notMine(now time.Time) error {
	if h.kind == dlockdriver.KindLock && h.d.s.live(h.name, now) != nil {
		return dlock.ErrTakenOver
	}
	return dlock.ErrNotHeld
}

// Steal makes req.Token the holder of req.Name at once, with the next fence
// (dlockdriver.Stealer); the previous holder finds out at its next refresh.
func (d *driver) Steal(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	var fence uint64
	err := d.link.Do(ctx, func() error {
		s := d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		s.fence++
		fence = s.fence
		s.locks[req.Name] = &entry{token: req.Token, expires: now.Add(req.TTL), fence: fence, metadata: req.Metadata, since: now}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &dlockdriver.Grant{Handle: &handle{d: d, name: req.Name, token: req.Token}, Fence: fence}, nil
}

func (h *handle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	return ttl, h.d.link.Do(ctx, func() error {
		s := h.d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		e := h.mine(now)
		if e == nil {
			return h.notMine(now)
		}
		e.expires = now.Add(ttl)
		return nil
	})
}

func (h *handle) Release(ctx context.Context) error {
	return h.d.link.Do(ctx, func() error {
		s := h.d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		if h.mine(now) == nil {
			return h.notMine(now)
		}
		if h.kind != dlockdriver.KindLock {
			h.releaseKind(now)
			return nil
		}
		delete(s.locks, h.name)
		for c := range s.watchers[h.name] {
			select {
			case c <- struct{}{}:
			default:
			}
		}
		return nil
	})
}

func (h *handle) Held(ctx context.Context) (bool, error) {
	var held bool
	err := h.d.link.Do(ctx, func() error {
		h.d.s.mu.Lock()
		defer h.d.s.mu.Unlock()
		held = h.mine(time.Now()) != nil
		return nil
	})
	return held, err
}

// Watchers reports how many waiters of any Locker watch name.
func (s *Store) Watchers(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers[name])
}

// Abandon removes the lock if req.Token holds it (an attempt whose reply was
// lost); see dlockdriver.Abandoner.
func (d *driver) Abandon(ctx context.Context, req dlockdriver.Request) error {
	h := &handle{d: d, name: req.Name, token: req.Token, kind: req.Kind}
	if err := h.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		return err
	}
	return nil
}

// RefreshBatch refreshes many leases in one request over the link
// (dlockdriver.BatchRefresher).
func (d *driver) RefreshBatch(ctx context.Context, hs []dlockdriver.Handle, ttls []time.Duration) ([]time.Duration, []error) {
	// A request the link delays may run after do returned: it fills
	// slices of its own, handed over only when do succeeded.
	var (
		mu      sync.Mutex
		granted []time.Duration
		errs    []error
	)
	err := d.link.Do(ctx, func() error {
		g, e := make([]time.Duration, len(hs)), make([]error, len(hs))
		s := d.s
		s.mu.Lock()
		now := time.Now()
		for i, h := range hs {
			if ent := h.(*handle).mine(now); ent != nil {
				ent.expires = now.Add(ttls[i])
				g[i] = ttls[i]
			} else {
				e[i] = h.(*handle).notMine(now)
			}
		}
		s.mu.Unlock()
		mu.Lock()
		granted, errs = g, e
		mu.Unlock()
		return nil
	})
	if err != nil {
		errs := make([]error, len(hs))
		for i := range errs {
			errs[i] = err
		}
		return make([]time.Duration, len(hs)), errs
	}
	mu.Lock()
	defer mu.Unlock()
	return granted, errs
}
