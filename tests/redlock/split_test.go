package redlock_test

import (
	"errors"
	"github.com/dlock/dlock/tests/internal/testutil"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/redlock"
)

// A split vote is led, not lost: five lockers, each nearest a different
// node, try at once, so that each first takes one node. Every contender
// sees the same five single votes, the lowest token leads (it keeps its node
// and asks the others again once the rest gave theirs back), and each round
// has exactly one winner, where before every contender gave up. The others
// are refused with a BusyError, and no lock of theirs is left on a node.
//
// The leader waits for the others to give their nodes back for up to four
// times its own first round, which the far nodes' latency makes: the
// others' retreats come late by however long the machine keeps their
// goroutines waiting. With far at 20ms (a leader's patience ~80ms), round
// 0 had no winner in 1 of 3 runs at load ~13 on 2 cores; at 100ms (scaled
// by DLOCK_TOLERANCE_SCALE) the leader tolerates ~300ms of such delay.
func TestSplitVoteLed(t *testing.T) {
	ctx := testutil.Ctx(t)
	c := newCluster(t, 5, nil)
	const lockers, rounds = 5, 5
	far := live(t, 100*time.Millisecond)
	ls := make([]*dlock.Locker, lockers)
	for j := range lockers {
		clients, ps := c.proxied(t)
		ls[j] = newLocker(t, clients, &redlock.Options{Defaults: dlock.Options{TTL: 5 * time.Second}})
		warm, err := ls[j].TryAcquire(ctx, "led-warm-"+strconv.Itoa(j), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := warm.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for i, p := range ps {
			if i != j {
				p.SetLatency(far / 2)
			}
		}
	}
	name := "led-" + testutil.RandomHex(4)
	var last uint64
	for r := range rounds {
		var wg sync.WaitGroup
		gate := make(chan struct{})
		won := make([]*dlock.Lease, lockers)
		for j := range lockers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				l, err := ls[j].TryAcquire(ctx, name, nil)
				var busy *dlockdriver.BusyError
				switch {
				case err == nil:
					won[j] = l
				case !errors.As(err, &busy):
					t.Errorf("round %d, locker %d: %v; want a BusyError", r, j, err)
				}
			}()
		}
		close(gate)
		wg.Wait()
		var winner *dlock.Lease
		for _, l := range won {
			if l != nil {
				if winner != nil {
					t.Fatalf("round %d: two lockers won the same lock at once", r)
				}
				winner = l
			}
		}
		if winner == nil {
			t.Fatalf("round %d: no winner; want the split vote led to a grant", r)
		}
		if f, _ := winner.Fence(); f <= last {
			t.Errorf("round %d: fencing token %d after %d", r, f, last)
		} else {
			last = f
		}
		if n := c.holders(t, lockKey(name), winner.Token()); n < 3 {
			t.Errorf("round %d: the winner holds %d nodes, want a majority", r, n)
		}
		if err := winner.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// The losers gave their nodes back: nothing is left once the
		// winner released.
		eventually(t, 2*time.Second, "no lock left on any node", func() bool { return len(c.present(t, lockKey(name))) == 0 })
	}
}
