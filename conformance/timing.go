package conformance

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dlock/dlock"
)

// ToleranceScaleEnv names the environment variable that multiplies every
// liveness bound of the suite (how late a signal, a grant or a return may
// come): DLOCK_TOLERANCE_SCALE=3 triples them for a slow or crowded machine.
// It is a positive number, default 1. Safety bounds (nobody granted before
// the previous holder's ValidUntil, ValidUntil counted from the request) are
// never scaled.
const ToleranceScaleEnv = "DLOCK_TOLERANCE_SCALE"

// DefaultTolerance is Config.Tolerance when left zero: generous enough for
// a loaded 2-core machine running every driver's suite at once, two busy
// loops beside it (load 7-8.5): at 250ms, a postgres semaphore waiter
// notified of a release was granted 258ms and 331ms after it.
const DefaultTolerance = 400 * time.Millisecond

var toleranceScale = sync.OnceValues(func() (float64, error) {
	v := os.Getenv(ToleranceScaleEnv)
	if v == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("conformance: %s=%q is not a positive number", ToleranceScaleEnv, v)
	}
	return f, nil
})

// live returns the liveness bound d multiplied by DLOCK_TOLERANCE_SCALE.
func (s *suite) live(d time.Duration) time.Duration {
	f, err := toleranceScale()
	if err != nil {
		s.t.Fatal(err)
	}
	return time.Duration(float64(d) * f)
}

// tol is Config.Tolerance, scaled.
func (s *suite) tol() time.Duration { return s.live(s.cfg.Tolerance) }

// scaled says, for a liveness bound's failure message, how the bound was
// scaled, or at 1 how to scale it: a bound missed on a busy machine says
// what to set.
func (s *suite) scaled() string {
	if f, _ := toleranceScale(); f != 1 {
		return fmt.Sprintf(", scaled ×%g by %s", f, ToleranceScaleEnv)
	}
	return fmt.Sprintf("; on a loaded machine, set %s=3", ToleranceScaleEnv)
}

// warm takes and releases a lock of its own through each locker, so that
// what the first acquisition pays once (dialing, sessions, script loading,
// prepared statements) is not counted by a timing assertion.
func (s *suite) warm(lockers ...*dlock.Locker) {
	s.t.Helper()
	for _, l := range lockers {
		s.release(s.acquire(l, s.name(), nil))
	}
}

// queued waits, after a waiter on name was started, until the backend
// stores an entry for name that is not in before (the waiter's queue key,
// node or lock-table row, as listed by Harness.Residue), or until stagger
// has passed, whichever comes first. It returns the entries now stored and
// whether a new one appeared. A backend whose Residue lists one entry per
// waiter gives an event to synchronise on; for the others (Residue lists
// only keys that exist, or waiters leave nothing on the server) the stagger
// is all there is.
func (s *suite) queued(name string, before []string, stagger time.Duration) ([]string, bool) {
	s.t.Helper()
	for end := time.Now().Add(stagger); ; time.Sleep(2 * time.Millisecond) {
		now, err := s.h.Residue(s.ctx, name)
		if err != nil {
			s.t.Fatalf("Residue(%q): %v", name, err)
		}
		for _, e := range now {
			if !slices.Contains(before, e) {
				return now, true
			}
		}
		if time.Now().After(end) {
			return now, false
		}
	}
}

// Live returns the liveness bound d multiplied by DLOCK_TOLERANCE_SCALE, for
// other suites built on this one's conventions (package queue's).
func Live(d time.Duration) (time.Duration, error) {
	f, err := toleranceScale()
	return time.Duration(float64(d) * f), err
}
