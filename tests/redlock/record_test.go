package redlock_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redlock"
)

// The record a majority wrote last wins over an older one that the other
// nodes still have (Record returns once a majority wrote it; the writes to
// the rest may still be on the way): a slot whose run succeeded after two
// failures is done for every Locker, whichever nodes answer first. Busy
// run 28 saw a Locker run the slot again, having read a stale failure from
// the first node to answer.
func TestOnceRecordNewestOfMajority(t *testing.T) {
	c := newCluster(t, 5, nil)
	ctx := t.Context()
	a := newLocker(t, c.clients(t), &redlock.Options{Defaults: dlock.Options{TTL: suiteTTL}})
	const job, slot = "record-newest", "2026-11-28T00:00:00Z"
	boom := errors.New("boom")
	if err := a.Once(ctx, job, slot, &dlock.OnceOptions{MaxAttempts: 5}, func(context.Context, *dlock.Lease) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("failing run: %v", err)
	}
	key := redlock.DefaultKeyPrefix + "{" + dlock.OnceName(job, slot) + "}:record"
	// Once returned when a majority had the failure's record; node 0 may be
	// one of the others, its write still on the way (busy run 36: "redis:
	// nil" at load 6). Read it from a node that has it.
	var failed string
	deadline := time.Now().Add(live(t, 10*time.Second))
	for failed == "" {
		for _, raw := range c.raws {
			if v, err := raw.Get(ctx, key).Result(); err == nil {
				failed = v
				break
			}
		}
		if failed == "" && time.Now().After(deadline) {
			t.Fatal("the failure's record is on no node")
		}
		if failed == "" {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := a.Once(ctx, job, slot, nil, func(context.Context, *dlock.Lease) error { return nil }); err != nil {
		t.Fatalf("succeeding run: %v", err)
	}
	// Three nodes that have the success's record (a majority wrote it; on
	// a loaded machine the lock, and so the record, may have reached only
	// three), and the other two as if its writes had not reached them yet.
	var done []int
	deadline = time.Now().Add(live(t, 10*time.Second))
	for {
		done = done[:0]
		for i, raw := range c.raws {
			if v, err := raw.Get(ctx, key).Result(); err == nil && v != failed {
				done = append(done, i)
			}
		}
		if len(done) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the success's record is on nodes %v only", done)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range c.raws {
		if slices.Contains(done[:3], i) {
			continue
		}
		if err := c.raws[i].Set(ctx, key, failed, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		b := newLocker(t, c.clients(t), &redlock.Options{Defaults: dlock.Options{TTL: suiteTTL}})
		ran := false
		err := b.Once(ctx, job, slot, nil, func(context.Context, *dlock.Lease) error { ran = true; return nil })
		if !errors.Is(err, dlock.ErrAlreadyDone) || ran {
			t.Fatalf("Locker %d: Once = %v, fn ran: %v; want ErrAlreadyDone (a majority has the success)", i, err, ran)
		}
	}
}
