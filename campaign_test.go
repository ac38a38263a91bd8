package dlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/memory"
)

func memLocker(t *testing.T, s *memory.Store) *dlock.Locker {
	t.Helper()
	l, err := memory.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// TestCampaignAgainAfterLoss proves that a leadership lost while fn runs
// ends fn's context and that Campaign campaigns again: fn runs once per
// term, terms strictly increase, and the end of ctx ends it all.
func TestCampaignAgainAfterLoss(t *testing.T) {
	l := memLocker(t, memory.NewStore())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var terms []uint64
	var lossCauses []error
	err := l.Campaign(ctx, "leader", "a", &dlock.Options{TTL: 100 * time.Millisecond, NoRefresh: true},
		func(fctx context.Context, lead *dlock.Lease) error {
			term, _ := lead.Fence()
			terms = append(terms, term)
			if len(terms) == 3 {
				cancel()
			}
			<-fctx.Done()
			lossCauses = append(lossCauses, context.Cause(fctx))
			return fctx.Err()
		})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Campaign = %v, want context.Canceled", err)
	}
	if len(terms) != 3 {
		t.Fatalf("fn ran for terms %v, want 3 terms", terms)
	}
	for i := 1; i < len(terms); i++ {
		if terms[i] <= terms[i-1] {
			t.Errorf("terms %v do not strictly increase", terms)
		}
	}
	for i, c := range lossCauses[:2] {
		if !errors.Is(c, dlock.ErrLost) {
			t.Errorf("term %d ended with cause %v, want ErrLost", i+1, c)
		}
	}
	if !errors.Is(lossCauses[2], context.Canceled) {
		t.Errorf("the last term ended with cause %v, want context.Canceled", lossCauses[2])
	}
	assertNoLeader(t, l, "leader")
}

func assertNoLeader(t *testing.T, l *dlock.Locker, name string) {
	t.Helper()
	ld, err := l.Leader(context.Background(), name)
	if err != nil || ld.Held {
		t.Errorf("Leader(%q) = %+v, %v after Campaign returned; want nobody", name, ld, err)
	}
}

// TestCampaignDoneResigns proves that fn returning while it leads ends the
// campaign with fn's error and resigns at once: a waiting candidate leads
// without waiting for the TTL.
func TestCampaignDoneResigns(t *testing.T) {
	s := memory.NewStore()
	a, b := memLocker(t, s), memLocker(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	boom := errors.New("boom")
	leading := make(chan struct{})
	finish := make(chan struct{})
	var aErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		aErr = a.Campaign(ctx, "handover", "a", &dlock.Options{TTL: time.Minute}, func(context.Context, *dlock.Lease) error {
			close(leading)
			<-finish
			return boom
		})
	})
	<-leading
	bLeads := make(chan time.Time, 1)
	wg.Go(func() {
		err := b.Campaign(ctx, "handover", "b", &dlock.Options{TTL: time.Minute}, func(context.Context, *dlock.Lease) error {
			bLeads <- time.Now()
			return nil
		})
		if err != nil {
			t.Errorf("b's Campaign = %v, want nil (its fn is done)", err)
		}
	})
	resigned := time.Now()
	close(finish)
	select {
	case at := <-bLeads:
		t.Logf("b led %v after a's fn returned", at.Sub(resigned))
	case <-time.After(10 * time.Second):
		t.Fatal("b did not lead within 10s of a's resignation (TTL 1m): a did not resign")
	}
	wg.Wait()
	if !errors.Is(aErr, boom) {
		t.Errorf("a's Campaign = %v, want fn's error", aErr)
	}
	assertNoLeader(t, a, "handover")
}

// TestCampaignCtxEndsWhileLeading proves that ctx's end reaches fn as its
// context's cause, and that Campaign resigns and returns ctx's error.
func TestCampaignCtxEndsWhileLeading(t *testing.T) {
	l := memLocker(t, memory.NewStore())
	ctx, cancel := context.WithCancelCause(t.Context())
	stop := errors.New("shutting down")
	var cause error
	err := l.Campaign(ctx, "shutdown", "a", nil, func(fctx context.Context, _ *dlock.Lease) error {
		cancel(stop)
		<-fctx.Done()
		cause = context.Cause(fctx)
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Campaign = %v, want context.Canceled", err)
	}
	if !errors.Is(cause, stop) {
		t.Errorf("fn's context ended with cause %v, want ctx's cause", cause)
	}
	assertNoLeader(t, l, "shutdown")
}

// TestCampaignBadInput proves that bad input is refused before any
// campaign, with ErrInvalid.
func TestCampaignBadInput(t *testing.T) {
	l := memLocker(t, memory.NewStore())
	fn := func(context.Context, *dlock.Lease) error { return nil }
	for _, tc := range []struct {
		what, name, candidate string
		fn                    func(context.Context, *dlock.Lease) error
		opts                  *dlock.Options
	}{
		{"nil fn", "x", "a", nil, nil},
		{"empty candidate", "x", "", fn, nil},
		{"empty name", "", "a", fn, nil},
		{"metadata", "x", "a", fn, &dlock.Options{Metadata: "m"}},
		{"negative TTL", "x", "a", fn, &dlock.Options{TTL: -time.Second}},
	} {
		if err := l.Campaign(t.Context(), tc.name, tc.candidate, tc.opts, tc.fn); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", tc.what, err)
		}
	}
}
