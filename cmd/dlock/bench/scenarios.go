package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// uncontended times N rounds of TryAcquire + Release by one worker.
func (r *runner) uncontended(ctx context.Context, lanes []*lane) {
	defer closeLanes(ctx, lanes)
	r.open(ctx, lanes, 1, "uncontended")
	rounds := r.turns(r.cfg.N, 20)
	alternate(ctx, rounds, lanes, func(l *lane, round int) error {
		s, name := l.sessions[0], r.lockName("uncontended", l.c.name)
		n := share(r.cfg.N, rounds, round)
		if len(l.samples) == 0 { // the lane's first turn: warm up, untimed
			for range min(r.cfg.N/10, 100) {
				h, ok, err := s.tryAcquire(ctx, name)
				if err != nil || !ok {
					break // the timed loop reports it
				}
				if err := s.release(ctx, h); err != nil {
					break
				}
			}
		}
		start := time.Now()
		defer func() {
			d := time.Since(start)
			l.elapsed += d
			l.marks, l.turnTime = append(l.marks, len(l.samples)), append(l.turnTime, d)
		}()
		for range n {
			t := time.Now()
			h, ok, err := s.tryAcquire(ctx, name)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%q was busy with no one else using it", name)
			}
			if err := s.release(ctx, h); err != nil {
				return fmt.Errorf("release: %w", err)
			}
			l.samples = append(l.samples, time.Since(t))
		}
		return nil
	})
	for _, l := range lanes {
		if complete(ctx, l) {
			lat := Summarize(l.samples, l.elapsed)
			lat.Rounds = SplitRounds(l.samples, l.marks, l.turnTime, r.cfg.Rounds)
			l.res.Uncontended = &lat
			l.summary = fmt.Sprintf("n=%d p50=%s p99=%s %s ops/s", lat.N, FormatDuration(lat.P50), FormatDuration(lat.P99), formatOps(lat.OpsPerSec))
		}
	}
}

// handoff times HandoffN handoffs between two independent clients of a lane.
func (r *runner) handoff(ctx context.Context, lanes []*lane) {
	defer closeLanes(ctx, lanes)
	r.open(ctx, lanes, 2, "handoff")
	rounds := r.turns(r.cfg.HandoffN, 5)
	alternate(ctx, rounds, lanes, func(l *lane, round int) error {
		name := r.lockName("handoff", l.c.name)
		defer func() { l.marks = append(l.marks, len(l.samples)) }()
		for range share(r.cfg.HandoffN, rounds, round) {
			d, err := r.handoffOnce(ctx, l.sessions[0], l.sessions[1], name)
			if err != nil {
				return fmt.Errorf("handoff %d: %w", len(l.samples), err)
			}
			l.samples = append(l.samples, d)
		}
		return nil
	})
	for _, l := range lanes {
		if complete(ctx, l) {
			lat := Summarize(l.samples, 0)
			lat.Rounds = SplitRounds(l.samples, l.marks, nil, r.cfg.Rounds)
			l.res.Handoff = &lat
			l.summary = fmt.Sprintf("n=%d p50=%s p99=%s", lat.N, FormatDuration(lat.P50), FormatDuration(lat.P99))
		}
	}
}

// handoffOnce: the holder takes name, the waiter blocks in acquire, and after
// Settle the holder releases at t0; the waiter's acquire returns at t1. It
// returns t1−t0. The waiter goroutine is always waited for.
func (r *runner) handoffOnce(ctx context.Context, holder, waiter session, name string) (time.Duration, error) {
	h, ok, err := holder.tryAcquire(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("holder: %w", err)
	}
	if !ok {
		return 0, fmt.Errorf("holder found %q busy", name)
	}
	type outcome struct {
		h   held
		at  time.Time
		err error
	}
	done := make(chan outcome, 1)
	// The wait is bounded: a waiter that misses the release still gets the
	// lock when the holder's TTL runs out, and a few seconds for polling.
	wctx, cancel := context.WithTimeout(ctx, r.cfg.Settle+r.cfg.TTL+5*time.Second)
	defer cancel()
	go func() {
		wh, err := waiter.acquire(wctx, name)
		done <- outcome{wh, time.Now(), err}
	}()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer rcancel()

	settle := time.NewTimer(r.cfg.Settle)
	defer settle.Stop()
	select {
	case o := <-done: // the waiter did not wait
		_ = holder.release(rctx, h)
		if o.err != nil {
			return 0, fmt.Errorf("waiter: %w", o.err)
		}
		_ = waiter.release(rctx, o.h)
		return 0, errors.New("the waiter was granted a lock that was held")
	case <-settle.C:
	}

	t0 := time.Now()
	if err := holder.release(ctx, h); err != nil {
		cancel()
		if o := <-done; o.err == nil {
			_ = waiter.release(rctx, o.h)
		}
		return 0, fmt.Errorf("holder release: %w", err)
	}
	o := <-done
	if o.err != nil {
		return 0, fmt.Errorf("waiter: %w", o.err)
	}
	if err := waiter.release(rctx, o.h); err != nil {
		return 0, fmt.Errorf("waiter release: %w", err)
	}
	return o.at.Sub(t0), nil
}

// throughput runs Workers workers, each on its own client, looping acquire →
// release for Duration (in Rounds turns): on one shared name (contended) or
// on one name each (independent).
func (r *runner) throughput(ctx context.Context, lanes []*lane, scenario string, shared bool) {
	defer closeLanes(ctx, lanes)
	w := r.cfg.Workers
	r.open(ctx, lanes, w, scenario)
	for _, l := range lanes {
		l.counts = make([]int64, w)
	}
	alternate(ctx, r.cfg.Rounds, lanes, func(l *lane, round int) error {
		// Fresh names every round: a worker stopped by the round's deadline
		// while its acquire request was in flight may have been granted the
		// lock on the server without learning it, and that lock would stay
		// for a whole TTL.
		names := make([]string, w)
		for i := range names {
			if shared {
				names[i] = r.lockName(scenario, l.c.name, "round", round)
			} else {
				names[i] = r.lockName(scenario, l.c.name, "round", round, i)
			}
		}
		d := r.cfg.Duration / time.Duration(r.cfg.Rounds)
		if round == 0 {
			d += r.cfg.Duration % time.Duration(r.cfg.Rounds)
		}
		var before int64
		for _, c := range l.counts {
			before += c
		}
		elapsed, overlaps, err := r.workers(ctx, l.sessions, names, d, l.counts)
		var after int64
		for _, c := range l.counts {
			after += c
		}
		l.rounds = append(l.rounds, float64(after-before)/elapsed.Seconds())
		l.elapsed += elapsed
		l.overlaps += overlaps
		if err != nil {
			return err
		}
		if overlaps > 0 {
			return fmt.Errorf("%d acquisitions were granted while another worker held the lock", overlaps)
		}
		return nil
	})
	for _, l := range lanes {
		if !complete(ctx, l) {
			continue
		}
		t := &Throughput{Elapsed: l.elapsed, Overlaps: l.overlaps, RoundOpsPerSec: l.rounds}
		Spread(t, l.counts)
		if shared {
			l.res.Contended = t
			l.summary = fmt.Sprintf("workers=%d %s ops/s fairness=%.2f (%d/%d)", t.Workers, formatOps(t.OpsPerSec), t.Fairness, t.Min, t.Max)
		} else {
			l.res.Independent = t
			l.summary = fmt.Sprintf("workers=%d %s ops/s", t.Workers, formatOps(t.OpsPerSec))
		}
	}
}

// workers runs one worker per session, session i looping on names[i] for d,
// and adds each worker's completed rounds to counts[i]. It returns the time
// from the start until the last worker stopped, and how many acquisitions
// were granted while another worker held the same name.
func (r *runner) workers(ctx context.Context, sessions []session, names []string, d time.Duration, counts []int64) (time.Duration, int64, error) {
	inside := make(map[string]*atomic.Int32, len(names)) // holders per name
	for _, n := range names {
		if inside[n] == nil {
			inside[n] = new(atomic.Int32)
		}
	}
	var overlaps atomic.Int64
	errs := make([]error, len(sessions))
	start := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(d))
	defer cancel()
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			n, errs[i] = loop(ctx, runCtx, s, names[i], inside[names[i]], &overlaps)
			counts[i] += n
		}()
	}
	wg.Wait()
	return time.Since(start), overlaps.Load(), errors.Join(errs...)
}

// loop is one throughput worker: acquire → release until runCtx ends. It
// returns how many rounds it completed.
func loop(ctx, runCtx context.Context, s session, name string, inside *atomic.Int32, overlaps *atomic.Int64) (int64, error) {
	var n int64
	for runCtx.Err() == nil {
		h, err := s.acquire(runCtx, name)
		if err != nil {
			if timeUp(runCtx) && ctx.Err() == nil {
				break // time is up
			}
			return n, fmt.Errorf("acquire: %w", err)
		}
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		inside.Add(-1)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		err = s.release(rctx, h)
		cancel()
		if err != nil {
			return n, fmt.Errorf("release: %w", err)
		}
		n++
	}
	return n, nil
}

// timeUp reports whether runCtx has ended or its deadline has passed. The
// deadline counts even before ctx says so: a server that was sent the
// deadline (etcd's gRPC) may answer "timed out" before this process's
// timer has ended runCtx, on a loaded machine.
func timeUp(runCtx context.Context) bool {
	if runCtx.Err() != nil {
		return true
	}
	d, ok := runCtx.Deadline()
	return ok && !time.Now().Before(d)
}

// complete reports whether l measured all it had to: it did not fail and
// the run was not cut short, which would leave a partial sample.
func complete(ctx context.Context, l *lane) bool { return l.err == nil && ctx.Err() == nil }
