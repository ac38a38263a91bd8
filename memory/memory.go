// Package memory is the in-process reference driver: a Store shared by any
// number of Lockers stands in for the lock server, so applications can test
// lock-using code without one, and driver authors can read the contract's
// reference implementation.
//
// # URLs
//
//	mem://              the process-wide default store
//	mem://NAME?ttl=10s  a process-wide store of that name
//
// Query parameters: the lock options of dlock.Options (ttl, refresh, …).
//
// # Guarantees
//
// Everything the contract asks, within one process: exclusive while valid,
// fencing tokens from one counter per Store (strictly increasing across all
// names), notified waiting. Locks do not survive the process. A Link between
// a Locker and its Store simulates network faults (partition, reset,
// latency) for tests.
//
// # Layout
//
// A map from lock name to {token, expiry, fence, metadata}; nothing outlives a
// released or expired lock but the Store's single fence counter.
package memory

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/dlock/dlock"
)

func init() {
	dlock.Register("mem", func(ctx context.Context, u *url.URL) (dlock.Locker, error) {
		q := u.Query()
		defaults, err := dlock.OptionsFromQuery(q)
		if err != nil {
			return nil, err
		}
		if err := dlock.RejectUnknown(q); err != nil {
			return nil, err
		}
		if u.Path != "" && u.Path != "/" || u.User != nil {
			return nil, fmt.Errorf("%w: mem URLs take only a store name as host, as in mem://NAME", dlock.ErrInvalid)
		}
		return New(NamedStore(u.Host), defaults)
	})
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
}

type entry struct {
	token    string
	expires  time.Time
	fence    uint64
	metadata string
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{locks: map[string]*entry{}, watchers: map[string]map[chan struct{}]struct{}{}}
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

// New returns a Locker on s (nil: the default store) with a perfect link.
func New(s *Store, defaults *dlock.Options) (dlock.Locker, error) {
	return NewLinked(s, defaults, nil)
}

// NewLinked returns a Locker on s whose every request crosses link (nil: a
// perfect one), so tests can partition, reset or slow it.
func NewLinked(s *Store, defaults *dlock.Options, link *Link) (dlock.Locker, error) {
	if s == nil {
		s = NamedStore("")
	}
	if link == nil {
		link = NewLink()
	}
	return dlock.New(&driver{s: s, link: link}, defaults)
}

type driver struct {
	s    *Store
	link *Link
}

func (d *driver) Capabilities() dlock.Capabilities {
	return dlock.Capabilities{Fencing: true, NotifiedWait: true, MinTTL: time.Millisecond}
}

func (d *driver) Close() error { return nil }

func (d *driver) TryAcquire(ctx context.Context, req dlock.Request) (*dlock.Grant, error) {
	var fence uint64
	err := d.link.do(ctx, func() error {
		s := d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		if e := s.live(req.Name, now); e != nil {
			return dlock.Busy(e.expires.Sub(now))
		}
		s.fence++
		fence = s.fence
		s.locks[req.Name] = &entry{token: req.Token, expires: now.Add(req.TTL), fence: fence, metadata: req.Metadata}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &dlock.Grant{Handle: &handle{d: d, name: req.Name, token: req.Token}, Fence: fence}, nil
}

func (d *driver) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
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
}

// mine returns the entry if it is still this handle's; s.mu held.
func (h *handle) mine(now time.Time) *entry {
	if e := h.d.s.live(h.name, now); e != nil && e.token == h.token {
		return e
	}
	return nil
}

func (h *handle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	return ttl, h.d.link.do(ctx, func() error {
		s := h.d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		e := h.mine(now)
		if e == nil {
			return dlock.ErrNotHeld
		}
		e.expires = now.Add(ttl)
		return nil
	})
}

func (h *handle) Release(ctx context.Context) error {
	return h.d.link.do(ctx, func() error {
		s := h.d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		if h.mine(time.Now()) == nil {
			return dlock.ErrNotHeld
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
	err := h.d.link.do(ctx, func() error {
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
// lost); see dlock.Abandoner.
func (d *driver) Abandon(ctx context.Context, req dlock.Request) error {
	h := &handle{d: d, name: req.Name, token: req.Token}
	if err := h.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		return err
	}
	return nil
}
