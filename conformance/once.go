package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
)

// The Once section, on drivers that declare Records: jobs run exactly once
// per schedule slot (Locker.Once).
var onceTests = []testCase{
	// Concurrent callers for one slot, on Lockers of their own: fn runs
	// once, never two at a time, and every other caller (having waited for
	// that run) returns ErrAlreadyDone.
	{name: "OnceConcurrent", need: needRecords, fn: testOnceConcurrent},
	// A completed slot stays done for a new caller, also after the Locker
	// that ran it was closed: the record lives on the backend.
	{name: "OnceDoneSurvivesClose", need: needRecords, fn: testOnceDoneSurvivesClose},
	// A run that failed leaves the slot open for the next caller; with
	// MaxAttempts, failures are counted and the slot is given up after them.
	{name: "OnceFailedRetried", need: needRecords, fn: testOnceFailedRetried},
	// A run whose lease is lost (its Locker black-holed) records nothing,
	// returns ErrLost, and the slot runs again on another Locker.
	{name: "OnceLostNotRecorded", need: needRecords, fn: testOnceLostNotRecorded},
	// A run whose lock was taken over (Steal) while its lease still looked
	// valid to it cannot record its completion: the backend refuses the
	// write in the step that checks the lock.
	{name: "OnceStolenNotRecorded", need: needRecordsSteal, fn: testOnceStolenNotRecorded},
	// A record survives a crash and restart of the server, on backends
	// that declare DurableRecords and harnesses that can restart them
	// (ServerFaults).
	{name: "OnceSurvivesRestart", need: needRecordsRestart, fn: testOnceSurvivesRestart},
	// Two hosts whose clocks differ by 30% of the period, each trying the
	// job at its own boundaries, run every one of consecutive slots exactly
	// once.
	{name: "OncePerSlot", need: needRecords, fn: testOncePerSlot},
}

func needRecords(c dlock.Capabilities) string {
	if !c.Records {
		return "Records"
	}
	return ""
}

func needRecordsRestart(c dlock.Capabilities) string {
	if m := needRecords(c); m != "" {
		return m
	}
	if !c.DurableRecords {
		return "DurableRecords"
	}
	return ""
}

func needRecordsSteal(c dlock.Capabilities) string {
	if m := needRecords(c); m != "" {
		return m
	}
	if !c.Steal {
		return "Steal"
	}
	return ""
}

// onceJob returns a job name unique to the subtest and registers the
// lock of its slot for the residue check.
func (s *suite) onceJob(slots ...string) string {
	job := s.name()
	for _, slot := range slots {
		s.names = append(s.names, dlock.OnceName(job, slot))
	}
	return job
}

const testSlot = "2026-11-28T03:00:00Z"

func testOnceConcurrent(s *suite) {
	const n = 4
	job := s.onceJob(testSlot)
	ls := make([]*dlock.Locker, n)
	for i := range ls {
		ls[i], _ = s.locker(s.opts())
	}
	var runs, running, overlap atomic.Int32
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = ls[i].Once(s.ctx, job, testSlot, nil, func(ctx context.Context, lease *dlock.Lease) error {
				if running.Add(1) > 1 {
					overlap.Add(1)
				}
				defer running.Add(-1)
				runs.Add(1)
				select { // long enough for the others to be waiting
				case <-time.After(s.cfg.TTL / 5):
				case <-ctx.Done():
				}
				return nil
			})
		}()
	}
	close(start)
	wg.Wait()
	if got := runs.Load(); got != 1 {
		s.t.Errorf("fn ran %d times for one slot; want 1", got)
	}
	if overlap.Load() > 0 {
		s.t.Errorf("fn ran on two callers at once")
	}
	ok, done := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, dlock.ErrAlreadyDone):
			done++
		default:
			s.t.Errorf("caller %d: %v; want nil or ErrAlreadyDone", i, err)
		}
	}
	if ok != 1 || done != n-1 {
		s.t.Errorf("%d callers returned nil and %d ErrAlreadyDone; want 1 and %d", ok, done, n-1)
	}
}

func testOnceDoneSurvivesClose(s *suite) {
	job := s.onceJob(testSlot)
	// Nothing here is about TTLs: at postgres's 500ms, a run's lease was
	// once lost before its record was written (busy run 26, load 8).
	opts := s.opts(ttl(max(s.cfg.TTL, 5*time.Second)))
	a, _ := s.h.NewLocker(s.t, opts)
	closed := false
	s.t.Cleanup(func() {
		if !closed {
			_ = a.Close(context.Background())
		}
	})
	ran := 0
	if err := a.Once(s.ctx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { ran++; return nil }); err != nil {
		s.t.Fatalf("first Once: %v", err)
	}
	if err := a.Once(s.ctx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { ran++; return nil }); !errors.Is(err, dlock.ErrAlreadyDone) {
		s.t.Errorf("Once again on the same Locker: %v; want ErrAlreadyDone", err)
	}
	cctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	closed = true
	if err := a.Close(cctx); err != nil {
		s.t.Fatalf("Close: %v", err)
	}
	b, _ := s.locker(opts)
	if err := b.Once(s.ctx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { ran++; return nil }); !errors.Is(err, dlock.ErrAlreadyDone) {
		s.t.Errorf("Once on another Locker after the first one closed: %v; want ErrAlreadyDone", err)
	}
	if ran != 1 {
		s.t.Errorf("fn ran %d times; want 1", ran)
	}
	// Another slot of the same job is another run.
	next := "2026-11-28T04:00:00Z"
	s.names = append(s.names, dlock.OnceName(job, next))
	if err := b.Once(s.ctx, job, next, nil, func(context.Context, *dlock.Lease) error { ran++; return nil }); err != nil || ran != 2 {
		s.t.Errorf("Once for the next slot: %v, fn ran %d times in all; want nil, 2", err, ran)
	}
}

func testOnceFailedRetried(s *suite) {
	job := s.onceJob(testSlot)
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	opts := &dlock.OnceOptions{MaxAttempts: 2}
	boom := errors.New("boom")
	ran := 0
	fail := func(context.Context, *dlock.Lease) error { ran++; return boom }
	if err := a.Once(s.ctx, job, testSlot, opts, fail); !errors.Is(err, boom) {
		s.t.Fatalf("first run: %v; want fn's error", err)
	}
	if err := b.Once(s.ctx, job, testSlot, opts, fail); !errors.Is(err, boom) {
		s.t.Fatalf("second run, on another Locker: %v; want fn's error", err)
	}
	if err := a.Once(s.ctx, job, testSlot, opts, fail); !errors.Is(err, dlock.ErrAttemptsExhausted) {
		s.t.Errorf("third call after two failures with MaxAttempts 2: %v; want ErrAttemptsExhausted", err)
	}
	if ran != 2 {
		s.t.Errorf("fn ran %d times; want 2", ran)
	}
	// Without a bound, the failed slot is open still; a success closes it.
	if err := b.Once(s.ctx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { ran++; return nil }); err != nil {
		s.t.Errorf("a run without MaxAttempts after the failures: %v; want nil", err)
	}
	if err := a.Once(s.ctx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { ran++; return nil }); !errors.Is(err, dlock.ErrAlreadyDone) {
		s.t.Errorf("after the success: %v; want ErrAlreadyDone", err)
	}
	if ran != 3 {
		s.t.Errorf("fn ran %d times; want 3", ran)
	}
}

func testOnceLostNotRecorded(s *suite) {
	job := s.onceJob(testSlot)
	a, fa := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	var healed atomic.Bool
	defer func() {
		if !healed.Load() {
			fa.Heal()
		}
	}()
	err := a.Once(s.ctx, job, testSlot, nil, func(ctx context.Context, _ *dlock.Lease) error {
		fa.Blackhole()
		// How soon a loss is signalled is the Expiry section's business:
		// here, only that it is, and what Once makes of it.
		select {
		case <-ctx.Done():
		case <-s.ctx.Done():
			s.t.Errorf("fn's context did not end after the black-hole, before the subtest's deadline")
		}
		fa.Heal()
		healed.Store(true)
		return nil // as if the work had finished: it must not count
	})
	if !errors.Is(err, dlock.ErrLost) {
		s.t.Fatalf("Once whose lease was lost: %v; want ErrLost", err)
	}
	ran := false
	if err := b.Once(s.ctx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { ran = true; return nil }); err != nil || !ran {
		s.t.Fatalf("Once on another Locker after the lost run: %v, ran %v; want nil, true", err, ran)
	}
	if err := a.Once(s.ctx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { return nil }); !errors.Is(err, dlock.ErrAlreadyDone) {
		s.t.Errorf("Once after the second run completed: %v; want ErrAlreadyDone", err)
	}
}

func testOnceStolenNotRecorded(s *suite) {
	job := s.onceJob(testSlot)
	name := dlock.OnceName(job, testSlot)
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	var stolen *dlock.Lease
	err := a.Once(s.ctx, job, testSlot, nil, func(ctx context.Context, lease *dlock.Lease) error {
		ls, err := b.Steal(s.ctx, name, nil)
		if err != nil {
			return fmt.Errorf("stealing the lock: %w", err)
		}
		// The old holder returns at once, before its refresh could tell it
		// of the steal: its record must be refused by the backend.
		stolen = ls
		return nil
	})
	if stolen != nil {
		s.release(stolen)
	}
	if !errors.Is(err, dlock.ErrNotHeld) {
		s.t.Fatalf("Once whose lock was stolen before it recorded: %v; want ErrNotHeld", err)
	}
	c, _ := s.locker(s.opts())
	ran := false
	if err := c.Once(s.ctx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { ran = true; return nil }); err != nil || !ran {
		s.t.Fatalf("Once after the stolen run : %v, ran %v; want nil, true", err, ran)
	}
}

func testOnceSurvivesRestart(s *suite) {
	srv, ok := s.h.(ServerFaults)
	if !ok {
		s.t.Skip("the harness has no ServerFaults: it cannot restart the backend")
	}
	job := s.onceJob(testSlot)
	a, _ := s.locker(s.opts())
	ran := 0
	if err := a.Once(s.ctx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { ran++; return nil }); err != nil {
		s.t.Fatalf("Once before the restart: %v", err)
	}
	if err := srv.RestartServer(s.ctx); err != nil {
		s.t.Fatalf("RestartServer: %v", err)
	}
	b, _ := s.locker(s.opts())
	// The backend may take a while to serve again after it answers (a
	// leader elected, the log replayed): Once is tried until it says.
	deadline := time.Now().Add(s.live(30 * time.Second))
	for {
		octx, cancel := context.WithTimeout(s.ctx, s.live(5*time.Second)+s.cfg.TTL)
		err := b.Once(octx, job, testSlot, nil, func(context.Context, *dlock.Lease) error { ran++; return nil })
		cancel()
		if errors.Is(err, dlock.ErrAlreadyDone) {
			break
		}
		if err == nil || ran > 1 {
			s.t.Fatalf("the slot ran again after the restart (Once: %v): its record did not survive", err)
		}
		if time.Now().After(deadline) || s.ctx.Err() != nil {
			s.t.Fatalf("Once after the restart: %v; want ErrAlreadyDone%s", err, s.scaled())
		}
		time.Sleep(s.cfg.TTL / 5)
	}
}

func testOncePerSlot(s *suite) {
	const slots = 8
	period := s.live(time.Second)
	skew := period * 3 / 10
	job := s.name()
	var mu sync.Mutex
	runs := map[string]int{}
	// Host b's clock runs skew ahead of a's: it tries each slot first, and
	// a, trying it skew later, must find it done.
	first := time.Now().Truncate(period).Add(2 * period)
	want := make([]string, slots)
	for i := range want {
		want[i] = dlock.Slot(first.Add(time.Duration(i)*period), period)
		s.names = append(s.names, dlock.OnceName(job, want[i]))
	}
	host := func(l *dlock.Locker, offset time.Duration) error {
		for i := range slots {
			// The host's clock reads real time + offset; it wakes at its
			// own boundary.
			at := first.Add(time.Duration(i)*period - offset)
			select {
			case <-time.After(time.Until(at)):
			case <-s.ctx.Done():
				return s.ctx.Err()
			}
			slot := dlock.Slot(time.Now().Add(offset), period)
			err := l.Once(s.ctx, job, slot, nil, func(ctx context.Context, _ *dlock.Lease) error {
				mu.Lock()
				runs[slot]++
				mu.Unlock()
				select { // the job takes a fifth of the period
				case <-time.After(period / 5):
				case <-ctx.Done():
				}
				return nil
			})
			if err != nil && !errors.Is(err, dlock.ErrAlreadyDone) {
				return fmt.Errorf("slot %s: %w", slot, err)
			}
		}
		return nil
	}
	a, _ := s.locker(s.opts())
	b, _ := s.locker(s.opts())
	errs := make(chan error, 2)
	go func() { errs <- host(a, 0) }()
	go func() { errs <- host(b, skew) }()
	for range 2 {
		if err := <-errs; err != nil {
			s.t.Error(err)
		}
	}
	total := 0
	for _, slot := range want {
		if runs[slot] != 1 {
			s.t.Errorf("slot %s ran %d times; want 1", slot, runs[slot])
		}
		total += runs[slot]
	}
	if len(runs) != slots || total != slots {
		s.t.Errorf("runs by slot: %v; want each of %v once", runs, want)
	}
	s.t.Logf("%d slots of %v, clocks %v apart: %d runs", slots, period, skew, total)
}
