package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redis"
)

// Metadata lives in P{N}:meta ("<token>\n<since_ms>\n<metadata>", with the
// lock's TTL, extended by refreshes, deleted by the release) only for a
// lease that has some: a lease without metadata writes no such key.
// Inspect reports it and when it was granted.
func TestMetadataLayout(t *testing.T) {
	ctx, raw, p, l := kindsSetup(t)
	if !l.Capabilities().Metadata {
		t.Fatal("the default layout does not declare Metadata")
	}
	meta := p + "{job}:meta"
	ls, err := l.TryAcquire(ctx, "job", &dlock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := raw.Exists(ctx, meta).Result(); n != 0 {
		t.Errorf("%s written for a lease without metadata", meta)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}

	before := time.Now()
	ls, err = l.TryAcquire(ctx, "job", &dlock.Options{TTL: 5 * time.Second, Metadata: "host-a\nrole b"})
	if err != nil {
		t.Fatal(err)
	}
	v, err := raw.Get(ctx, meta).Result()
	if err != nil || !strings.HasPrefix(v, ls.Token()+"\n") || !strings.HasSuffix(v, "\nhost-a\nrole b") {
		t.Errorf("GET %s = %q, %v; want the token, the grant time and the metadata", meta, v, err)
	}
	if pttl, err := raw.PTTL(ctx, meta).Result(); err != nil || pttl <= 4*time.Second || pttl > 5*time.Second {
		t.Errorf("PTTL %s = %v, %v; want in (4s, 5s]", meta, pttl, err)
	}
	if err := ls.Refresh(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if pttl, err := raw.PTTL(ctx, meta).Result(); err != nil || pttl <= 19*time.Second {
		t.Errorf("after a refresh to 20s PTTL %s = %v, %v; want above 19s", meta, pttl, err)
	}
	info, err := l.Inspect(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if info.Metadata != "host-a\nrole b" {
		t.Errorf("Inspect Metadata = %q, want %q", info.Metadata, "host-a\nrole b")
	}
	if d := info.Since.Sub(before); d < -time.Second || d > 5*time.Second {
		t.Errorf("Inspect Since = %v, want about %v", info.Since, before)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := raw.Exists(ctx, meta).Result(); n != 0 {
		t.Errorf("%s left after the release", meta)
	}

	// A former holder's metadata is not reported for a holder without any.
	ls, err = l.TryAcquire(ctx, "job", nil)
	if err != nil {
		t.Fatal(err)
	}
	raw.Set(ctx, meta, "0123\n1\nstale", time.Minute)
	if info, err := l.Inspect(ctx, "job"); err != nil || info.Metadata != "" || !info.Since.IsZero() {
		t.Errorf("Inspect beside a stale metadata key: %+v, %v; want no metadata", info, err)
	}
	raw.Del(ctx, meta)
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Leadership passes from a leader that resigns to the candidate queued
// behind it (release.lua hands the lock and the candidate's metadata over),
// and from a leader that dies (no refresh) to the next one at its TTL
// (acquire.lua's takeover), with a higher term each time; Leader names
// each; a candidate that gives up leaves nothing.
func TestElectionHandover(t *testing.T) {
	ctx, raw, p, la := kindsSetup(t)
	lb := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})
	lc := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})

	a, err := la.Elect(ctx, "ctl", "a", &dlock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	termA, _ := a.Fence()
	if ld, err := lb.Leader(ctx, "ctl"); err != nil || !ld.Held || ld.Candidate != "a" || ld.Term != termA {
		t.Errorf("Leader = %+v, %v; want a with term %d", ld, err, termA)
	}

	// c waits and gives up: its entry and metadata field go.
	cctx, cancel := context.WithCancel(ctx)
	cdone := make(chan error, 1)
	go func() {
		_, err := lc.Elect(cctx, "ctl", "c", nil)
		cdone <- err
	}()
	waitQueued(t, raw, p+"{ctl}", 1)
	if f, _ := raw.HKeys(ctx, p+"{ctl}:waiters").Result(); len(f) != 2 {
		t.Errorf("waiter fields %q; want the entry and its metadata", f)
	}
	cancel()
	if err := <-cdone; !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("c gave up: got %v, want ErrNotAcquired", err)
	}
	waitExists(t, raw, p+"{ctl}:waiters", false)

	bres := make(chan result, 1)
	go func() {
		ls, err := lb.Elect(ctx, "ctl", "b", &dlock.Options{TTL: 300 * time.Millisecond, NoRefresh: true})
		bres <- result{ls, err, time.Now()}
	}()
	waitQueued(t, raw, p+"{ctl}", 1)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-bres
	if r.err != nil {
		t.Fatal(r.err)
	}
	termB, _ := r.ls.Fence()
	if termB <= termA {
		t.Errorf("b's term %d after a's %d", termB, termA)
	}
	if ld, err := la.Leader(ctx, "ctl"); err != nil || ld.Candidate != "b" || ld.Term != termB {
		t.Errorf("Leader = %+v, %v; want b with term %d", ld, err, termB)
	}

	// b dies (no refresh, TTL 300ms): a, queued meanwhile, takes over.
	ares := make(chan result, 1)
	go func() {
		ls, err := la.Elect(ctx, "ctl", "a2", &dlock.Options{TTL: 5 * time.Second})
		ares <- result{ls, err, time.Now()}
	}()
	r = <-ares
	if r.err != nil {
		t.Fatal(r.err)
	}
	termA2, _ := r.ls.Fence()
	if termA2 <= termB {
		t.Errorf("a2's term %d after b's %d", termA2, termB)
	}
	if ld, err := lb.Leader(ctx, "ctl"); err != nil || ld.Candidate != "a2" || ld.Term != termA2 {
		t.Errorf("Leader = %+v, %v; want a2 with term %d", ld, err, termA2)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ld, err := lb.Leader(ctx, "ctl"); err != nil || ld.Held {
		t.Errorf("Leader after the last resignation = %+v, %v; want none", ld, err)
	}
}

// A leader that resigns with nobody queued is seen gone by Observe at
// once (its release publishes on the name's channel), not at its TTL.
func TestObserveSeesResignation(t *testing.T) {
	ctx, _, p, l := kindsSetup(t)
	lo := newLocker(t, newClient(t, redisAddr(t)), &redis.Options{KeyPrefix: p})
	lead, err := l.Elect(ctx, "ctl", "a", &dlock.Options{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := lo.Observe(octx, "ctl")
	if err != nil {
		t.Fatal(err)
	}
	if ld := <-c; !ld.Held || ld.Candidate != "a" {
		t.Fatalf("first report %+v; want a leading", ld)
	}
	time.Sleep(50 * time.Millisecond) // let Observe watch and wait
	resigned := time.Now()
	if err := lead.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case ld := <-c:
		if ld.Held {
			t.Errorf("after the resignation Observe reports %+v; want nobody", ld)
		}
		if d := time.Since(resigned); d > 5*time.Second {
			t.Errorf("Observe reported the resignation after %v; want at once (TTL 30s)", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Observe did not report the resignation within 10s (TTL 30s)")
	}
	cancel()
	for range c {
	}
}
