package bench

import (
	"context"
	"sync"
	"time"
)

// Floor is a backend's raw-client floor: the fewest client calls that make a
// TTL lock on that backend with no library around them. The bench measures
// it in the same run as the dlock driver, so that the driver's overhead is
// read off against the backend's own cost rather than guessed.
//
// Each Floor is one independent client, as a separate process would have;
// the bench opens one per worker. A Floor is used by one goroutine at a time.
type Floor interface {
	// TryLock makes one attempt to take name for token, expiring after ttl.
	// It reports false, without error, when someone else holds it.
	TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error)
	// Unlock removes name if it is still held for token.
	Unlock(ctx context.Context, name, token string) error
	// Close releases the client.
	Close() error
}

// FloorOpener opens one independent Floor client.
type FloorOpener func(ctx context.Context) (Floor, error)

// MemoryFloors returns an opener of Floors that share one in-process
// mutex-map store: the floor for the memory driver.
func MemoryFloors() FloorOpener {
	s := &memStore{locks: map[string]memLock{}}
	return func(context.Context) (Floor, error) { return memFloor{s}, nil }
}

type memStore struct {
	mu    sync.Mutex
	locks map[string]memLock
}

type memLock struct {
	token   string
	expires time.Time
}

type memFloor struct{ s *memStore }

func (f memFloor) TryLock(_ context.Context, name, token string, ttl time.Duration) (bool, error) {
	now := time.Now()
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if l, ok := f.s.locks[name]; ok && now.Before(l.expires) {
		return false, nil
	}
	f.s.locks[name] = memLock{token: token, expires: now.Add(ttl)}
	return true, nil
}

func (f memFloor) Unlock(_ context.Context, name, token string) error {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if l, ok := f.s.locks[name]; ok && l.token == token {
		delete(f.s.locks, name)
	}
	return nil
}

func (f memFloor) Close() error { return nil }
