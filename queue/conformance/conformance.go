package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	lockconf "github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/queue"
)

// Faults are the faults the suite injects into one client's connections:
// the lock suite's (a faultnet.Proxy or memory.Link has them).
type Faults = lockconf.Faults

// Harness connects the suite to a driver.
type Harness interface {
	// NewClient returns a new client with connections of its own, dialled
	// through faults the suite may inject. The suite closes it.
	NewClient(t *testing.T) (*queue.Client, Faults)
	// Residue lists what the backend still stores for the queue (keys,
	// rows), so that a drained queue that leaves anything behind fails.
	Residue(ctx context.Context, queue string) ([]string, error)
}

// subtestTimeout bounds each subtest (scaled as a liveness bound): its
// context ends then, and a subtest still running subtestGrace later (a
// driver call that ignores its context) panics with its name, so that a
// broken driver fails the suite rather than hanging it for go test's
// whole timeout.
const (
	subtestTimeout = 2 * time.Minute
	subtestGrace   = 30 * time.Second
)

// Run runs every property against the harness.
func Run(t *testing.T, h Harness) {
	t.Helper()
	limit, err := lockconf.Live(subtestTimeout)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), limit)
			watchdog := time.AfterFunc(limit+subtestGrace, func() {
				panic(fmt.Sprintf("queue/conformance: %s did not finish within %v: a driver call ignores its context", t.Name(), limit))
			})
			t.Cleanup(func() { watchdog.Stop(); cancel() })
			s := &suite{t: t, h: h, ctx: ctx}
			tc.fn(s)
		})
	}
}

type suite struct {
	t   *testing.T
	h   Harness
	ctx context.Context
}

type testCase struct {
	name string
	fn   func(*suite)
}

// client returns a new client, closed at the end of the subtest.
func (s *suite) client() (*queue.Client, Faults) {
	s.t.Helper()
	c, f := s.h.NewClient(s.t)
	s.t.Cleanup(func() { _ = c.Close() })
	return c, f
}

// queue returns a queue with a name unique to this subtest on c, whose
// residue is checked at the end of the subtest when drained is set.
func (s *suite) queue(c *queue.Client, opts *queue.Options) *queue.Queue {
	s.t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.ReplaceAll(fmt.Sprintf("dlock-qconf/%s/%s", s.t.Name(), hex.EncodeToString(b[:])), " ", "_")
	q, err := c.Queue(name, opts)
	if err != nil {
		s.t.Fatalf("Queue(%q): %v", name, err)
	}
	return q
}

// same returns the queue of the same name on another client.
func (s *suite) same(c *queue.Client, q *queue.Queue, opts *queue.Options) *queue.Queue {
	s.t.Helper()
	q2, err := c.Queue(q.Name(), opts)
	if err != nil {
		s.t.Fatal(err)
	}
	return q2
}

// live scales a liveness bound.
func (s *suite) live(d time.Duration) time.Duration {
	l, err := lockconf.Live(d)
	if err != nil {
		s.t.Fatal(err)
	}
	return l
}

// noResidue checks that the backend keeps nothing for a drained queue.
func (s *suite) noResidue(q *queue.Queue) {
	s.t.Helper()
	left, err := s.h.Residue(s.ctx, q.Name())
	if err != nil {
		s.t.Fatalf("Residue: %v", err)
	}
	if len(left) > 0 {
		s.t.Errorf("the drained queue %q leaves %v on the backend", q.Name(), left)
	}
}

// eventually polls cond until it holds or the bound passes.
func (s *suite) eventually(bound time.Duration, what string, cond func() bool) {
	s.t.Helper()
	for end := time.Now().Add(s.live(bound)); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			s.t.Fatalf("%s: not within %v", what, s.live(bound))
		}
	}
}
