package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/dlock/dlock"
)

// session is one independent client: a dlock.Locker, a Floor or a peer. It is used
// by one goroutine at a time.
type session interface {
	tryAcquire(ctx context.Context, name string) (held, bool, error)
	// acquire waits until name is held or ctx ends (then the error matches
	// dlock.ErrNotAcquired and ctx.Err()).
	acquire(ctx context.Context, name string) (held, error)
	release(ctx context.Context, h held) error
	close(ctx context.Context) error
}

// held is a lock a session holds.
type held struct {
	lease       *dlock.Lease // dlock
	name, token string       // floor, peer
}

// dlockSession is a dlock.Locker, taking every lock with the same options.
type dlockSession struct {
	l    *dlock.Locker
	opts *dlock.Options
}

func (s *dlockSession) tryAcquire(ctx context.Context, name string) (held, bool, error) {
	ls, err := s.l.TryAcquire(ctx, name, s.opts)
	if err != nil {
		if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
			return held{}, false, nil
		}
		return held{}, false, err
	}
	return held{lease: ls}, true, nil
}

func (s *dlockSession) acquire(ctx context.Context, name string) (held, error) {
	ls, err := s.l.Acquire(ctx, name, s.opts)
	return held{lease: ls}, err
}

func (s *dlockSession) release(ctx context.Context, h held) error { return h.lease.Release(ctx) }

func (s *dlockSession) close(ctx context.Context) error { return s.l.Close(ctx) }

// floorSession drives a Floor the way a hand-written client would: a token
// per acquisition, and a tight loop of attempts to wait. It drives a peer
// the same way, but for its own wait.
type floorSession struct {
	f      Floor
	ttl    time.Duration
	prefix string // unique to the session
	seq    uint64
}

func (s *floorSession) token() string {
	s.seq++
	return s.prefix + strconv.FormatUint(s.seq, 10)
}

func (s *floorSession) tryAcquire(ctx context.Context, name string) (held, bool, error) {
	tok := s.token()
	ok, err := s.f.TryLock(ctx, name, tok, s.ttl)
	if err != nil || !ok {
		return held{}, false, err
	}
	return held{name: name, token: tok}, true, nil
}

// acquire waits with the Floor's own wait when it has one (a Waiter: a
// peer), else spins: the raw client's only way to wait.
func (s *floorSession) acquire(ctx context.Context, name string) (held, error) {
	tok := s.token()
	if w, ok := s.f.(Waiter); ok {
		if err := w.Lock(ctx, name, tok, s.ttl); err != nil {
			if ctx.Err() != nil {
				return held{}, errors.Join(dlock.ErrNotAcquired, ctx.Err(), err)
			}
			return held{}, err
		}
		return held{name: name, token: tok}, nil
	}
	for {
		ok, err := s.f.TryLock(ctx, name, tok, s.ttl)
		if ctx.Err() != nil {
			if ok && err == nil {
				return held{name: name, token: tok}, nil
			}
			return held{}, errors.Join(dlock.ErrNotAcquired, ctx.Err())
		}
		if err != nil {
			return held{}, err
		}
		if ok {
			return held{name: name, token: tok}, nil
		}
	}
}

func (s *floorSession) release(ctx context.Context, h held) error {
	return s.f.Unlock(ctx, h.name, h.token)
}

func (s *floorSession) close(context.Context) error { return s.f.Close() }

// closeAll closes sessions with a fresh deadline: a run cut short by ctx
// still gives its locks back.
func closeAll(ctx context.Context, sessions []session) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	errs := make([]error, 0, len(sessions))
	for _, s := range sessions {
		errs = append(errs, s.close(cctx))
	}
	return errors.Join(errs...)
}

// warm takes and gives back name once: connections are dialled and scripts
// loaded before anything is timed.
func warm(ctx context.Context, s session, name string) error {
	h, ok, err := s.tryAcquire(ctx, name)
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if !ok {
		return fmt.Errorf("warm-up: %q is busy", name)
	}
	if err := s.release(ctx, h); err != nil {
		return fmt.Errorf("warm-up release: %w", err)
	}
	return nil
}
