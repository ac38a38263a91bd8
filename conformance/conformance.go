package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// Harness connects the suite to one backend.
type Harness interface {
	// NewLocker returns a new Locker on the backend under test, independent
	// of every other one (its own client and connections), whose traffic
	// crosses its own Faults. defaults are the Locker's default Options. The
	// suite closes the Locker; the harness cleans up the rest with
	// t.Cleanup. It calls t.Fatal when it cannot.
	NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, Faults)

	// Residue lists what the backend still stores for the lock name (keys,
	// nodes, rows, server-side lock entries), leaving out what the driver
	// documents as permanent by design (such as a fencing counter). The suite
	// calls it after every lease on name has ended and expects nothing.
	Residue(ctx context.Context, name string) ([]string, error)
}

// Faults injects real network faults into one Locker's path to the backend.
// *faultnet.Proxy implements it.
type Faults interface {
	// Blackhole drops all traffic both ways, keeping connections open: a
	// silent partition.
	Blackhole()
	// Heal ends a Blackhole.
	Heal()
	// Reset abruptly closes every open connection.
	Reset()
	// SetLatency delays traffic in each direction by d (0: none).
	SetLatency(d time.Duration)
}

// Config tunes the suite for slow backends. The zero value is fine for most.
type Config struct {
	// TTL is the base lock TTL of the timing tests. Default: the larger of
	// 500ms and the driver's MinTTL.
	TTL time.Duration
	// Tolerance is the scheduling slack allowed on liveness assertions (a
	// signal expected at time T may come up to Tolerance after it).
	// Default DefaultTolerance (400ms). Like every liveness bound it is
	// multiplied by DLOCK_TOLERANCE_SCALE; safety bounds have no tolerance.
	Tolerance time.Duration
	// Chaos is how long the Chaos section injects faults. Default 20s; the
	// variable DLOCK_CHAOS_DURATION overrides it (see ChaosDurationEnv).
	Chaos time.Duration
	// PartialServerFaults says that the harness's ServerFaults take down only
	// part of the backend (a minority of Redlock's nodes), so that locks may
	// be granted while it is paused. Without it the Chaos section checks
	// that a paused backend grants nothing.
	PartialServerFaults bool
}

// Run runs the whole suite against the backend behind h.
func Run(t *testing.T, h Harness) { RunConfig(t, h, Config{}) }

// RunConfig is Run with tuning.
func RunConfig(t *testing.T, h Harness, cfg Config) {
	caps, cfg := setup(t, h, cfg)
	for _, tc := range tests {
		runTest(t, h, caps, cfg, tc)
	}
	for _, tc := range primitiveTests {
		runTest(t, h, caps, cfg, tc)
	}
	for _, tc := range workTests {
		runTest(t, h, caps, cfg, tc)
	}
	for _, tc := range allTests {
		runTest(t, h, caps, cfg, tc)
	}
	for _, tc := range stealTests {
		runTest(t, h, caps, cfg, tc)
	}
	for _, tc := range onceTests {
		runTest(t, h, caps, cfg, tc)
	}
}

// RunChaos runs the Chaos section alone, for a harness that breaks the
// backend differently from the one given to Run (such as a majority of
// Redlock's nodes instead of a minority).
func RunChaos(t *testing.T, h Harness, cfg Config) {
	caps, cfg := setup(t, h, cfg)
	for _, tc := range tests {
		if tc.name == "Chaos" {
			runTest(t, h, caps, cfg, tc)
		}
	}
}

// setup reads the driver's capabilities and fills in cfg's defaults.
func setup(t *testing.T, h Harness, cfg Config) (dlock.Capabilities, Config) {
	probe, _ := h.NewLocker(t, nil)
	caps := probe.Capabilities()
	if err := probe.Close(context.Background()); err != nil {
		t.Fatalf("closing the probe locker: %v", err)
	}
	if cfg.TTL == 0 {
		cfg.TTL = max(500*time.Millisecond, caps.MinTTL)
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultTolerance
	}
	return caps, cfg
}

func runTest(t *testing.T, h Harness, caps dlock.Capabilities, cfg Config, tc testCase) {
	t.Run(tc.name, func(t *testing.T) {
		if tc.need != nil {
			if missing := tc.need(caps); missing != "" {
				t.Skipf("driver does not declare capability %s", missing)
			}
		}
		var extra time.Duration
		if tc.long {
			d, err := chaosDuration(cfg)
			if err != nil {
				t.Fatal(err)
			}
			extra = 2 * d
		}
		s := newSuite(t, h, caps, cfg, extra)
		tc.fn(s)
		s.checkResidue()
	})
}

type testCase struct {
	name string
	need func(dlock.Capabilities) string // names a missing capability, or ""
	long bool                            // runs for Config.Chaos and more
	fn   func(s *suite)
}

// suite is the state of one subtest.
type suite struct {
	t     *testing.T
	h     Harness
	caps  dlock.Capabilities
	cfg   Config
	ctx   context.Context // ends at the subtest's deadline
	names []string
	mu    sync.Mutex
	ttl   time.Duration // the longest TTL opts handed out, under mu
}

func newSuite(t *testing.T, h Harness, caps dlock.Capabilities, cfg Config, extra time.Duration) *suite {
	// A driver that ignores contexts must fail the suite, not hang it: past
	// the deadline (and a grace period for cleanup) the binary panics with
	// the subtest's name.
	limit := 30*time.Second + 20*(cfg.TTL+caps.ExpirySlack) + extra
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	watchdog := time.AfterFunc(limit+30*time.Second, func() {
		panic(fmt.Sprintf("conformance: %s did not finish within %v: a driver call ignores its context", t.Name(), limit))
	})
	t.Cleanup(func() { watchdog.Stop(); cancel() })
	return &suite{t: t, h: h, caps: caps, cfg: cfg, ctx: ctx}
}

// name returns a lock name unique to this subtest.
func (s *suite) name() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	n := fmt.Sprintf("dlock-conf/%s/%d-%s", s.t.Name(), len(s.names), hex.EncodeToString(b[:]))
	n = strings.ReplaceAll(n, " ", "_")
	s.names = append(s.names, n)
	return n
}

// locker returns a new independent locker, closed at the end of the subtest.
func (s *suite) locker(defaults *dlock.Options) (*dlock.Locker, Faults) {
	s.t.Helper()
	l, f := s.h.NewLocker(s.t, defaults)
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+s.cfg.TTL)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			s.t.Errorf("Close: %v", err)
		}
	})
	return l, f
}

// opts returns Options with the suite's TTL, changed by the given edits.
func (s *suite) opts(edit ...func(*dlock.Options)) *dlock.Options {
	o := &dlock.Options{TTL: s.cfg.TTL}
	for _, e := range edit {
		e(o)
	}
	s.mu.Lock()
	s.ttl = max(s.ttl, o.TTL)
	s.mu.Unlock()
	return o
}

func noRefresh(o *dlock.Options) { o.NoRefresh = true }

func ttl(d time.Duration) func(*dlock.Options) { return func(o *dlock.Options) { o.TTL = d } }

// checkResidue runs after the subtest's lockers are closed (it is registered
// first, so it runs last) and asserts that the backend keeps nothing for
// any name the subtest used.
func (s *suite) checkResidue() {
	s.t.Cleanup(func() {
		if s.t.Failed() {
			return
		}
		// A second per name at least: a harness may dial the backend
		// for each (DeadlineAtGrant uses some sixty names). A Residue
		// that fails is asked again until then: the harness's own
		// connection may still be coming back after a server restart
		// (busy run 28: ZooKeeper's, 10 s after OnceSurvivesRestart).
		ctx, cancel := context.WithTimeout(context.Background(), s.live(30*time.Second)+time.Duration(len(s.names))*time.Second)
		defer cancel()
		for _, n := range s.names {
			// A lock that was lost on purpose, or whose release reached
			// only some nodes, may still sit on the server until its
			// TTL (the longest the subtest used): give it that long.
			s.mu.Lock()
			longest := max(s.cfg.TTL, s.ttl)
			s.mu.Unlock()
			deadline := time.Now().Add(longest + s.caps.ExpirySlack + s.tol())
			for {
				left, err := s.h.Residue(ctx, n)
				if err != nil {
					if ctx.Err() != nil {
						s.t.Errorf("Residue(%q): %v", n, err)
						break
					}
					time.Sleep(s.cfg.TTL / 10)
					continue
				}
				if len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					s.t.Errorf("backend still stores %v for %q after the subtest", left, n)
					break
				}
				time.Sleep(s.cfg.TTL / 10)
			}
		}
	})
}

// acquire takes name through l or fails the test.
func (s *suite) acquire(l *dlock.Locker, name string, o *dlock.Options) *dlock.Lease {
	s.t.Helper()
	ls, err := l.Acquire(s.ctx, name, o)
	if err != nil {
		s.t.Fatalf("Acquire(%q): %v", name, err)
	}
	return ls
}

func (s *suite) release(ls *dlock.Lease) {
	s.t.Helper()
	if err := ls.Release(s.ctx); err != nil {
		s.t.Fatalf("Release(%q): %v", ls.Name(), err)
	}
}

// grant is what an acquisition started in the background returned, and when.
type grant struct {
	ls  *dlock.Lease
	err error
	at  time.Time
}

// background starts acquire in a goroutine; its grant arrives on the channel.
func background(acquire func() (*dlock.Lease, error)) <-chan grant {
	c := make(chan grant, 1)
	go func() {
		ls, err := acquire()
		c <- grant{ls, err, time.Now()}
	}()
	return c
}

// waitDone waits for the lease to end, up to limit.
func (s *suite) waitDone(ls *dlock.Lease, limit time.Duration) time.Time {
	s.t.Helper()
	select {
	case <-ls.Done():
		return time.Now()
	case <-time.After(limit):
		s.t.Fatalf("lease %q did not end within %v", ls.Name(), limit)
	case <-s.ctx.Done():
		s.t.Fatalf("subtest deadline passed waiting for %q to end", ls.Name())
	}
	return time.Time{}
}

// stillHeld fails the test unless ls is held according to the server and
// has not signalled loss.
func (s *suite) stillHeld(ls *dlock.Lease) {
	s.t.Helper()
	select {
	case <-ls.Done():
		s.t.Fatalf("lease %q ended: %v", ls.Name(), ls.Err())
	default:
	}
	ok, err := ls.Held(s.ctx)
	if err != nil || !ok {
		s.t.Fatalf("Held(%q) = %v, %v; want true, nil", ls.Name(), ok, err)
	}
}
