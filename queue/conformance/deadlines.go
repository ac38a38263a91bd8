package conformance

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/queue"
)

// Deadlines against the clients' clocks. The server keeps due times and
// claim deadlines on its own clock, to the millisecond; a client measures
// durations on its own. The checks here are safety checks, never scaled:
// each compares an instant that is certainly after the server's decision
// (a reply's arrival) with one certainly before the request it answers
// (the client's clock read before sending), so that a backend rounding a
// deadline the unsafe way fails them and a slow machine cannot.

// claimRounds is how many times testUntilBeforeRedelivery races a second
// client against a claim's Until.
const claimRounds = 40

func testUntilBeforeRedelivery(s *suite) {
	a, _ := s.client()
	b, _ := s.client()
	qa := s.queue(a, nil)
	qb := s.same(b, qa, nil)
	// Visibilities of whole and of fractional milliseconds.
	vis := []time.Duration{30 * time.Millisecond, 30*time.Millisecond + 900*time.Microsecond, 31*time.Millisecond - time.Microsecond}
	early, worst := 0, time.Duration(0) // worst: the largest Until - arrival
	for i := range claimRounds {
		id := fmt.Sprintf("r%02d", i)
		s.enqueue(qa, id, nil, queue.Added)
		first := s.claimOne(qa, vis[i%len(vis)])
		// The second client asks again and again, with no wait between: it
		// takes the task as soon as the server lets it.
		var second *queue.Claim
		for second == nil {
			cs, err := qb.Claim(s.ctx, 1, time.Minute)
			got := time.Now()
			if err != nil {
				s.t.Fatalf("round %d: Claim: %v", i, err)
			}
			if len(cs) == 0 {
				runtime.Gosched()
				continue
			}
			second = cs[0]
			d := first.Until().Sub(got)
			if d > 0 {
				early++
			}
			if i == 0 || d > worst {
				worst = d
			}
		}
		if second.ID != id || second.Attempts != 2 {
			s.t.Fatalf("round %d: the second claim took %s attempt %d, want %s attempt 2", i, second.ID, second.Attempts, id)
		}
		if err := second.Ack(s.ctx); err != nil {
			s.t.Fatal(err)
		}
	}
	s.t.Logf("the second claim arrived %v after the first claim's Until at the soonest", -worst)
	if early > 0 {
		s.t.Errorf("in %d of %d rounds another client claimed the task before the first claim's Until (by up to %v): Until is later than the server's deadline",
			early, claimRounds, worst)
	}
	s.noResidue(qa)
}

// claimRecord is one delivery by Claim, as the worker that got it saw it.
type claimRecord struct {
	attempts int
	got      time.Time // when the reply arrived: after the server's claim
	until    time.Time // the claim's Until
}

func testNoOverlappingClaims(s *suite) {
	const (
		tasks, workers = 2000, 8
		vis            = 150*time.Millisecond + 900*time.Microsecond // not whole milliseconds
		batch          = 4
	)
	// Every task's first claim is left to run out and its next one acked:
	// every task is claimed again right at a claim's deadline. A late Ack
	// (a loaded machine) makes a third delivery: no dead-lettering here.
	opts := &queue.Options{MaxAttempts: 1 << 20}
	p, _ := s.client()
	qp := s.queue(p, opts)
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, s.live(90*time.Second))
	defer cancel()
	var (
		mu     sync.Mutex
		claims = map[string][]claimRecord{}
		left   atomic.Int64
		wg     sync.WaitGroup
		errs   = make(chan error, workers)
	)
	left.Store(tasks)
	for w := range workers {
		c, _ := s.client()
		q := s.same(c, qp, opts)
		wg.Go(func() {
			for left.Load() > 0 && ctx.Err() == nil {
				wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
				cs, err := q.ClaimWait(wctx, batch, vis)
				got := time.Now()
				wcancel()
				if errors.Is(err, context.DeadlineExceeded) {
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				mu.Lock()
				for _, cl := range cs {
					claims[cl.ID] = append(claims[cl.ID], claimRecord{cl.Attempts, got, cl.Until()})
				}
				mu.Unlock()
				for _, cl := range cs {
					if cl.Attempts == 1 {
						continue // let it run out
					}
					switch err := cl.Ack(ctx); {
					case err == nil:
						left.Add(-1)
					case errors.Is(err, queue.ErrClaimLost): // too late: delivered again
					default:
						errs <- fmt.Errorf("worker %d: Ack %s: %w", w, cl.ID, err)
						return
					}
				}
			}
		})
	}
	// Tasks come one a millisecond, each waking the waiting workers: claims
	// are made at every moment, also just after others' deadlines.
	tick := time.NewTicker(time.Millisecond)
	for i := 0; i < tasks && ctx.Err() == nil; i++ {
		if _, err := qp.Enqueue(ctx, fmt.Sprintf("t%04d", i), nil); err != nil {
			s.t.Errorf("Enqueue: %v", err)
			cancel()
			break
		}
		<-tick.C
	}
	tick.Stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		s.t.Error(err)
	}
	if err := ctx.Err(); err != nil {
		s.t.Fatalf("%d of %d tasks not acked in %v", left.Load(), tasks, time.Since(start).Round(time.Second))
	}
	overlaps, worst, deliveries := 0, time.Duration(0), 0
	for id, cs := range claims {
		deliveries += len(cs)
		slices.SortFunc(cs, func(a, b claimRecord) int { return a.attempts - b.attempts })
		for i := 1; i < len(cs); i++ {
			if cs[i].attempts == cs[i-1].attempts {
				s.t.Errorf("task %s: delivery %d made twice", id, cs[i].attempts)
			}
			if d := cs[i-1].until.Sub(cs[i].got); d > 0 {
				overlaps++
				worst = max(worst, d)
			}
		}
	}
	s.t.Logf("%d tasks, %d deliveries, %d claims overlapping the previous claim's Until", tasks, deliveries, overlaps)
	if overlaps > 0 {
		s.t.Errorf("%d claims were delivered before the previous claim's Until (by up to %v): two claims current at once", overlaps, worst)
	}
	s.noResidue(qp)
}

func testDelayMany(s *suite) {
	const tasks, workers = 300, 3
	p, _ := s.client()
	qp := s.queue(p, nil)
	ctx, cancel := context.WithTimeout(s.ctx, s.live(60*time.Second))
	defer cancel()
	var (
		mu     sync.Mutex
		sentAt = map[string]time.Time{} // the enqueuer's clock before sending, + Delay
		gotAt  = map[string]time.Time{}
		left   atomic.Int64
		wg     sync.WaitGroup
		errs   = make(chan error, workers)
	)
	left.Store(tasks)
	for w := range workers {
		c, _ := s.client()
		q := s.same(c, qp, nil)
		// The workers ask again and again, with no wait between: each task
		// is taken as soon as the server lets it.
		wg.Go(func() {
			for left.Load() > 0 && ctx.Err() == nil {
				cs, err := q.Claim(ctx, 10, time.Minute)
				got := time.Now()
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				if len(cs) == 0 {
					runtime.Gosched()
					continue
				}
				mu.Lock()
				for _, cl := range cs {
					gotAt[cl.ID] = got
				}
				mu.Unlock()
				for _, cl := range cs {
					if err := cl.Ack(ctx); err != nil {
						errs <- fmt.Errorf("worker %d: Ack %s: %w", w, cl.ID, err)
						return
					}
					left.Add(-1)
				}
			}
		})
	}
	for i := range tasks {
		id := fmt.Sprintf("d%03d", i)
		// Delays of whole and of fractional milliseconds, 2 to 40ms.
		delay := 2*time.Millisecond + time.Duration(i*131%38000)*time.Microsecond
		mu.Lock()
		sentAt[id] = time.Now().Add(delay)
		mu.Unlock()
		if _, err := qp.Enqueue(ctx, id, &queue.EnqueueOptions{Delay: delay}); err != nil {
			s.t.Errorf("Enqueue %s: %v", id, err)
			break
		}
	}
	if s.t.Failed() {
		cancel()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		s.t.Error(err)
	}
	if err := ctx.Err(); err != nil {
		s.t.Fatalf("%d of %d tasks not delivered within %v", left.Load(), tasks, s.live(60*time.Second))
	}
	early, worst := 0, time.Duration(0)
	for id, due := range sentAt {
		if d := due.Sub(gotAt[id]); d > 0 {
			early++
			worst = max(worst, d)
		}
	}
	if early > 0 {
		s.t.Errorf("%d of %d delayed tasks delivered before their enqueue's send time + Delay (by up to %v)", early, tasks, worst)
	}
	s.noResidue(qp)
}
