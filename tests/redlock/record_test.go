package redlock_test

import (
	"context"
	"errors"
	"testing"

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
	failed, err := c.raws[0].Get(ctx, key).Result()
	if err != nil {
		t.Fatalf("the failure's record on node 0: %v", err)
	}
	if err := a.Once(ctx, job, slot, nil, func(context.Context, *dlock.Lease) error { return nil }); err != nil {
		t.Fatalf("succeeding run: %v", err)
	}
	// Nodes 3 and 4 as if the success's writes had not reached them yet.
	for _, i := range []int{3, 4} {
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
