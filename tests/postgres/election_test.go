package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/tests/internal/testutil"
)

// Leadership passing back and forth between two candidates, resigning as
// soon as they lead: every leader an observer sees (Observe, and Leader
// asked in a loop) names its candidate, and the terms it sees increase,
// strictly from one reported change to the next. The new leader holds the
// lock before its session writes its metadata row, and the old one deletes
// its row before it unlocks: neither moment may show as a leader without a
// candidate and with term 0.
func TestElectionTermsIncrease(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.Require(t, dlocktest.Postgres)
	a := newLocker(t, srv.Addr(), nil)
	b := newLocker(t, srv.Addr(), nil)
	o := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	const rounds = 100 // leaderships per candidate

	octx, stop := context.WithCancel(ctx)
	defer stop()
	obs, err := o.Observe(octx, name)
	if err != nil {
		t.Fatal(err)
	}
	var checks sync.WaitGroup
	var seen [2]int // leaders seen by Observe, by Leader
	check := func(i int, what string, next func() (dlock.Leader, bool)) {
		defer checks.Done()
		var last dlock.Leader
		bad := 0
		for {
			ld, ok := next()
			if !ok {
				if bad > 3 {
					t.Errorf("%s: %d leaders without a candidate or term in all", what, bad)
				}
				return
			}
			if !ld.Held {
				continue
			}
			switch {
			case ld.Candidate == "" || ld.Term == 0:
				bad++
				if bad <= 3 {
					t.Errorf("%s: a leader with Candidate %q and Term %d (after %+v)", what, ld.Candidate, ld.Term, last)
				}
				continue
			case ld.Term < last.Term || ld.Term == last.Term && ld.Candidate != last.Candidate:
				t.Errorf("%s: term %d (%s) after term %d (%s)", what, ld.Term, ld.Candidate, last.Term, last.Candidate)
			case i == 0 && ld.Term == last.Term:
				t.Errorf("%s reported term %d (%s) twice", what, ld.Term, ld.Candidate)
			}
			if ld.Term != last.Term {
				seen[i]++
			}
			last = ld
		}
	}
	checks.Add(2)
	go check(0, "Observe", func() (dlock.Leader, bool) {
		ld, ok := <-obs
		return ld, ok
	})
	go check(1, "Leader", func() (dlock.Leader, bool) {
		if octx.Err() != nil {
			return dlock.Leader{}, false
		}
		ld, err := o.Leader(octx, name)
		if err != nil && octx.Err() == nil {
			t.Errorf("Leader: %v", err)
		}
		return ld, err == nil
	})

	var campaigns sync.WaitGroup
	for _, c := range []struct {
		l    *dlock.Locker
		name string
	}{{a, "alpha"}, {b, "beta"}} {
		campaigns.Go(func() {
			for i := range rounds {
				ls, err := c.l.Elect(ctx, name, fmt.Sprintf("%s-%d", c.name, i), nil)
				if err != nil {
					t.Errorf("%s: Elect: %v", c.name, err)
					return
				}
				if err := ls.Release(ctx); err != nil {
					t.Errorf("%s: resigning: %v", c.name, err)
					return
				}
			}
		})
	}
	campaigns.Wait()
	stop()
	checks.Wait()
	t.Logf("%d leaderships; terms seen: %d by Observe, %d by Leader", 2*rounds, seen[0], seen[1])
	if seen[0] == 0 || seen[1] == 0 {
		t.Errorf("an observer saw no leader")
	}
}
