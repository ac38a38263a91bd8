package dlocktest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"time"

	"go.uber.org/goleak"
)

// TB is the part of testing.TB that the Require functions use; *testing.T
// and *testing.B satisfy it. It is declared here rather than taken from
// package testing so that this package, which commands may import, does not
// link package testing (and its flags) into their binaries.
type TB interface {
	Helper()
	Context() context.Context
	Cleanup(func())
	Error(args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// requireTimeout bounds Require and RequireNew, a first image build included.
const requireTimeout = 10 * time.Minute

// RequireBackendsEnv names the variable that, set to 1, makes the Require
// functions fail instead of skipping when Docker is not usable.
const RequireBackendsEnv = "DLOCK_REQUIRE_BACKENDS"

// Require returns the test binary's shared server of the given kind (see
// Shared), starting it on first use. Tests must not pause, stop or close it:
// use RequireNew for that. Call CloseAll (or Main) from TestMain to remove
// it.
//
// Without Docker, Require skips the test, or fails it when
// DLOCK_REQUIRE_BACKENDS=1; any other error fails it.
func Require(tb TB, kind Kind) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), requireTimeout)
	defer cancel()
	s, err := Shared(ctx, kind)
	if err != nil {
		requireFailed(tb, string(kind)+" server", err)
	}
	return s
}

// RequireNew starts a server of the given kind for this test alone, closed by
// tb.Cleanup: one the test may pause, stop and restart. It skips and fails as
// Require does, and also skips when DLOCK_<KIND>_ADDR names an external server,
// since no dedicated one can be had then.
func RequireNew(tb TB, kind Kind) *Server {
	tb.Helper()
	return RequireNewWith(tb, kind, nil)
}

// RequireNewWith is RequireNew with StartOptions, e.g. a shorter ZooKeeper
// tickTime.
func RequireNewWith(tb TB, kind Kind, opts *StartOptions) *Server {
	tb.Helper()
	if _, ok, _ := externalAddr(kind); ok {
		tb.Skipf("dlocktest: this test needs its own %s server, but %s names an external one", kind, envVar(kind))
	}
	ctx, cancel := context.WithTimeout(tb.Context(), requireTimeout)
	defer cancel()
	s, err := Start(ctx, kind, opts)
	if err != nil {
		requireFailed(tb, string(kind)+" server", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// requireFailed skips the test when Docker is not usable and
// DLOCK_REQUIRE_BACKENDS is not set, and fails it otherwise.
func requireFailed(tb TB, what string, err error) {
	tb.Helper()
	if errors.Is(err, ErrNoDocker) && !backendsRequired() {
		tb.Skipf("no %s: %v\n(DLOCK_<KIND>_ADDR may name a throwaway server; %s=1 turns this skip into a failure)",
			what, err, RequireBackendsEnv)
	}
	tb.Fatalf("starting %s: %v", what, err)
}

func backendsRequired() bool {
	v, _ := strconv.ParseBool(os.Getenv(RequireBackendsEnv))
	return v
}

// Main is a TestMain for test binaries that start servers:
//
//	func TestMain(m *testing.M) { dlocktest.Main(m) }
//
// It runs the tests, removes the binary's containers (CloseAll), then fails
// the binary if goroutines were left behind (go.uber.org/goleak), and exits.
func Main(m interface{ Run() int }) { goleak.VerifyTestMain(closingM{m}) }

// closingM removes the containers after the tests and before goleak looks
// for leftover goroutines.
type closingM struct{ m interface{ Run() int } }

func (c closingM) Run() int {
	code := c.m.Run()
	if err := CloseAll(); err != nil {
		os.Stderr.WriteString("dlocktest: closing test servers: " + err.Error() + "\n")
		if code == 0 {
			code = 1
		}
	}
	return code
}
