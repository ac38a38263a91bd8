package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
)

// record is a lock name's record (dlockdriver.Recorder): kept in the Store,
// apart from the lock, until it expires.
type record struct {
	value   string
	expires time.Time
}

// Record writes the record of h's lock name if h still holds the lock, in
// one step under the Store's lock (dlockdriver.Recorder).
func (d *driver) Record(ctx context.Context, h dlockdriver.Handle, value string, ttl time.Duration) error {
	mh, ok := h.(*handle)
	if !ok || mh.d != d || mh.kind != dlockdriver.KindLock {
		return fmt.Errorf("%w: memory: Record takes a lock's handle of this driver", dlock.ErrInvalid)
	}
	return d.link.Do(ctx, func() error {
		s := d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		if mh.mine(now) == nil {
			return fmt.Errorf("%w: memory: recording %q: %w", dlock.ErrNotHeld, mh.name, mh.notMine(now))
		}
		if s.records == nil {
			s.records = map[string]record{}
		}
		s.records[mh.name] = record{value: value, expires: now.Add(ttl)}
		// Expired records go as new ones come: a few at a time.
		n := 0
		for k, r := range s.records {
			if n++; n > 8 {
				break
			}
			if !now.Before(r.expires) {
				delete(s.records, k)
			}
		}
		return nil
	})
}

// Recorded reads name's record (dlockdriver.Recorder).
func (d *driver) Recorded(ctx context.Context, name string) (value string, ok bool, err error) {
	err = d.link.Do(ctx, func() error {
		s := d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		r, found := s.records[name]
		if found && time.Now().Before(r.expires) {
			value, ok = r.value, true
		}
		return nil
	})
	return value, ok, err
}

// Records reports how many unexpired records the store keeps.
func (s *Store) Records() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	now := time.Now()
	for _, r := range s.records {
		if now.Before(r.expires) {
			n++
		}
	}
	return n
}
