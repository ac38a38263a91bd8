package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/queue"
)

var tests = []testCase{
	// Bad input is ErrInvalid before any I/O: the same on a black-holed
	// client, at once.
	{"InvalidInput", testInvalid},
	// An id queued already keeps its payload and place (deduplication)
	// unless the enqueue asks to replace or reschedule it; the result says
	// which happened.
	{"Dedup", testDedup},
	// Peek shows due tasks in due order without taking them; Pop takes them
	// once (at most once); delayed tasks are neither shown nor taken.
	{"DueOrderPeekPop", testDueOrder},
	// A delayed task is never delivered before its delay has passed since
	// the enqueue was sent, and is delivered to a waiting ClaimWait soon
	// after.
	{"DelayHonoured", testDelay},
	// Many delayed tasks, taken by workers that ask without pause: none is
	// delivered before its enqueue's send time + Delay (deadlines.go).
	{"DelayNeverEarly", testDelayMany},
	// A claim's Until is never later than the server's deadline: a second
	// client asking without pause never gets the task before it.
	{"UntilBeforeRedelivery", testUntilBeforeRedelivery},
	// 2,000 tasks, 8 workers, each task's first claim left to run out: no
	// claim arrives before the previous claim's Until (0 overlaps).
	{"NoOverlappingClaims", testNoOverlappingClaims},
	// A stale claim (expired, the task claimed again by another worker)
	// can neither Ack, Extend nor Nack: ErrClaimLost, and the current
	// claim's Ack still removes the task; Delete compares the due time.
	{"StaleClaimChangesNothing", testStaleClaim},
	// A worker that vanishes (black-holed) with a claim: the task is
	// delivered again to another worker once the claim runs out, with its
	// attempts raised.
	{"RedeliveryAfterWorkerVanishes", testRedelivery},
	// After MaxAttempts deliveries a task is dead-lettered: counted, listed
	// by Dead, moved back by Requeue with its attempts reset.
	{"DeadLetter", testDeadLetter},
	// Many workers on one queue over a run of tasks: never two current
	// claims on one task, and every task acked exactly once.
	{"ConcurrentWorkers", testConcurrentWorkers},
	// Connection resets in the middle of enqueues, claims and acks lose no
	// task: every task is acked at least once and the queue drains.
	{"ResetsLoseNothing", testResets},
	// A blocked ClaimWait (and PopWait) is woken by an Enqueue from another
	// client, long before its fallback timer.
	{"WaitWokenByEnqueue", testWoken},
}

func testInvalid(s *suite) {
	c, f := s.client()
	q := s.queue(c, nil)
	f.Blackhole()
	defer f.Heal()
	ctx := s.ctx
	for _, tc := range []struct {
		what string
		call func() error
	}{
		{"empty id", func() error { _, err := q.Enqueue(ctx, "", nil); return err }},
		{"negative delay", func() error { _, err := q.Enqueue(ctx, "x", &queue.EnqueueOptions{Delay: -time.Second}); return err }},
		{"oversized payload", func() error {
			_, err := q.Enqueue(ctx, "x", &queue.EnqueueOptions{Payload: make([]byte, queue.MaxPayload+1)})
			return err
		}},
		{"replace and reschedule", func() error {
			_, err := q.Enqueue(ctx, "x", &queue.EnqueueOptions{Replace: true, Reschedule: true})
			return err
		}},
		{"n = 0", func() error { _, err := q.Claim(ctx, 0, time.Second); return err }},
		{"n too large", func() error { _, err := q.Pop(ctx, queue.MaxBatch+1); return err }},
		{"zero visibility", func() error { _, err := q.Claim(ctx, 1, 0); return err }},
		{"peek n < 0", func() error { _, err := q.Peek(ctx, -1); return err }},
		{"requeue negative delay", func() error { _, err := q.Requeue(ctx, "x", -1); return err }},
		{"invalid UTF-8 id", func() error { _, err := q.Enqueue(ctx, "\xff", nil); return err }},
	} {
		start := time.Now()
		if err := tc.call(); !errors.Is(err, queue.ErrInvalid) {
			s.t.Errorf("%s: got %v, want ErrInvalid", tc.what, err)
		}
		if d := time.Since(start); d > s.live(100*time.Millisecond) {
			s.t.Errorf("%s took %v on a black-holed client: not rejected before I/O", tc.what, d)
		}
	}
	if _, err := c.Queue("", nil); !errors.Is(err, queue.ErrInvalid) {
		s.t.Errorf("empty queue name: got %v, want ErrInvalid", err)
	}
}

func (s *suite) enqueue(q *queue.Queue, id string, o *queue.EnqueueOptions, want queue.EnqueueResult) {
	s.t.Helper()
	got, err := q.Enqueue(s.ctx, id, o)
	if err != nil || got != want {
		s.t.Fatalf("Enqueue(%q): %v, %v; want result %v", id, got, err, want)
	}
}

func testDedup(s *suite) {
	c, _ := s.client()
	q := s.queue(c, nil)
	s.enqueue(q, "a", &queue.EnqueueOptions{Payload: []byte("first")}, queue.Added)
	s.enqueue(q, "a", &queue.EnqueueOptions{Payload: []byte("second")}, queue.Kept)
	ts, err := q.Peek(s.ctx, 10)
	if err != nil || len(ts) != 1 || string(ts[0].Payload) != "first" {
		s.t.Fatalf("Peek after a duplicate enqueue: %+v, %v; want one task with the first payload", ts, err)
	}
	s.enqueue(q, "a", &queue.EnqueueOptions{Payload: []byte("third"), Replace: true}, queue.Replaced)
	s.enqueue(q, "a", &queue.EnqueueOptions{Delay: time.Hour, Reschedule: true}, queue.Rescheduled)
	if ts, err := q.Peek(s.ctx, 10); err != nil || len(ts) != 0 {
		s.t.Fatalf("Peek after rescheduling an hour away: %+v, %v; want none due", ts, err)
	}
	st, err := q.Stats(s.ctx)
	if err != nil || st != (queue.Stats{Delayed: 1}) {
		s.t.Fatalf("Stats: %+v, %v; want one delayed", st, err)
	}
	s.enqueue(q, "a", &queue.EnqueueOptions{Reschedule: true}, queue.Rescheduled)
	ts, err = q.Pop(s.ctx, 10)
	if err != nil || len(ts) != 1 || string(ts[0].Payload) != "third" {
		s.t.Fatalf("Pop: %+v, %v; want the replaced payload, rescheduled to now", ts, err)
	}
	s.noResidue(q)
}

func testDueOrder(s *suite) {
	c, _ := s.client()
	q := s.queue(c, nil)
	base := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	for i, id := range []string{"c", "a", "d", "b"} {
		at := base.Add(time.Duration([]int{3, 1, 4, 2}[i]) * time.Millisecond)
		s.enqueue(q, id, &queue.EnqueueOptions{At: at, Payload: []byte(id)}, queue.Added)
	}
	s.enqueue(q, "later", &queue.EnqueueOptions{Delay: time.Hour}, queue.Added)
	ts, err := q.Peek(s.ctx, 10)
	if got := ids(ts); err != nil || got != "a b c d" {
		s.t.Fatalf("Peek: %q, %v; want a b c d (due order, the delayed one left out)", got, err)
	}
	ts, err = q.Pop(s.ctx, 3)
	if got := ids(ts); err != nil || got != "a b c" {
		s.t.Fatalf("Pop(3): %q, %v; want a b c", got, err)
	}
	if !ts[0].Due.Equal(base.Add(time.Millisecond)) {
		s.t.Errorf("Pop's due time %v, want %v as enqueued", ts[0].Due, base.Add(time.Millisecond))
	}
	ts, err = q.Pop(s.ctx, 3)
	if got := ids(ts); err != nil || got != "d" {
		s.t.Fatalf("second Pop: %q, %v; want d alone (popped tasks are gone)", got, err)
	}
	if n, err := q.Len(s.ctx); err != nil || n != 1 {
		s.t.Fatalf("Len: %d, %v; want the delayed task", n, err)
	}
	if ok, err := q.Delete(s.ctx, "later", time.Now()); err != nil || ok {
		s.t.Fatalf("Delete with another due time: %v, %v; want false", ok, err)
	}
	s.enqueue(q, "later", &queue.EnqueueOptions{Reschedule: true}, queue.Rescheduled)
	ts, _ = q.Peek(s.ctx, 1)
	if len(ts) != 1 {
		s.t.Fatal("Peek lost the rescheduled task")
	}
	if ok, err := q.Delete(s.ctx, "later", ts[0].Due); err != nil || !ok {
		s.t.Fatalf("Delete with the due time Peek showed: %v, %v; want true", ok, err)
	}
	s.noResidue(q)
}

func ids(ts []queue.Task) string {
	var b []string
	for _, t := range ts {
		b = append(b, t.ID)
	}
	return strings.Join(b, " ")
}

func testDelay(s *suite) {
	c, _ := s.client()
	c2, _ := s.client()
	q := s.queue(c, nil)
	q2 := s.same(c2, q, nil)
	const delay = 400 * time.Millisecond
	got := make(chan time.Time, 1)
	errc := make(chan error, 1)
	go func() {
		cs, err := q2.ClaimWait(s.ctx, 1, time.Minute)
		if err == nil && len(cs) == 1 {
			if err = cs[0].Ack(s.ctx); err == nil {
				got <- time.Now()
				return
			}
		}
		errc <- fmt.Errorf("ClaimWait: %v, %v", cs, err)
	}()
	sent := time.Now()
	s.enqueue(q, "later", &queue.EnqueueOptions{Delay: delay}, queue.Added)
	if cs, err := q.Claim(s.ctx, 1, time.Minute); err != nil || len(cs) != 0 {
		s.t.Fatalf("Claim right after a delayed enqueue: %v, %v; want nothing", cs, err)
	}
	select {
	case at := <-got:
		if early := at.Sub(sent); early < delay {
			s.t.Fatalf("delivered %v after the enqueue was sent, before its delay %v", early, delay)
		}
		if late := at.Sub(sent) - delay; late > s.live(time.Second) {
			s.t.Errorf("delivered %v after it was due (bound %v)", late, s.live(time.Second))
		}
	case err := <-errc:
		s.t.Fatal(err)
	case <-s.ctx.Done():
		s.t.Fatal("not delivered")
	}
	s.noResidue(q)
}

// claim takes exactly one task.
func (s *suite) claimOne(q *queue.Queue, vis time.Duration) *queue.Claim {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, s.live(30*time.Second))
	defer cancel()
	cs, err := q.ClaimWait(ctx, 1, vis)
	if err != nil || len(cs) != 1 {
		s.t.Fatalf("ClaimWait: %v, %v; want one task", cs, err)
	}
	return cs[0]
}

func testStaleClaim(s *suite) {
	c, _ := s.client()
	c2, _ := s.client()
	q := s.queue(c, nil)
	q2 := s.same(c2, q, nil)
	s.enqueue(q, "t", &queue.EnqueueOptions{Payload: []byte("p")}, queue.Added)
	stale := s.claimOne(q, 200*time.Millisecond)
	if stale.Attempts != 1 || string(stale.Payload) != "p" {
		s.t.Fatalf("first claim: %+v", stale.Task)
	}
	if time.Until(stale.Until()) > 200*time.Millisecond {
		s.t.Fatalf("Until %v away, beyond the visibility", time.Until(stale.Until()))
	}
	current := s.claimOne(q2, time.Minute) // waits for the claim to run out
	if current.Attempts != 2 {
		s.t.Fatalf("second delivery: attempts %d, want 2", current.Attempts)
	}
	for what, err := range map[string]error{
		"Ack": stale.Ack(s.ctx), "Extend": stale.Extend(s.ctx, time.Minute), "Nack": stale.Nack(s.ctx, 0),
	} {
		if !errors.Is(err, queue.ErrClaimLost) {
			s.t.Errorf("%s of a stale claim: %v, want ErrClaimLost", what, err)
		}
	}
	if st, err := q.Stats(s.ctx); err != nil || st.Claimed != 1 {
		s.t.Fatalf("after the stale claim's calls: %+v, %v; want the task still claimed", st, err)
	}
	if err := current.Extend(s.ctx, time.Minute); err != nil {
		s.t.Fatalf("Extend of the current claim: %v", err)
	}
	if err := current.Ack(s.ctx); err != nil {
		s.t.Fatalf("Ack of the current claim: %v", err)
	}
	if err := current.Ack(s.ctx); !errors.Is(err, queue.ErrClaimLost) {
		s.t.Errorf("second Ack: %v, want ErrClaimLost", err)
	}
	s.noResidue(q)
}

func testRedelivery(s *suite) {
	a, fa := s.client()
	b, _ := s.client()
	qa := s.queue(a, nil)
	qb := s.same(b, qa, nil)
	s.enqueue(qb, "job", &queue.EnqueueOptions{Payload: []byte("work")}, queue.Added)
	const vis = 300 * time.Millisecond
	claimed := s.claimOne(qa, vis)
	fa.Blackhole() // the worker vanishes: it can neither ack nor extend
	again := s.claimOne(qb, time.Minute)
	// Safety, strict: the second delivery's reply cannot come before the
	// first claim's Until (counted from before its request was sent). Time
	// taken after the first claim's reply would be late by that reply's
	// trip, and read a correct redelivery as early under load.
	if at := time.Now(); at.Before(claimed.Until()) {
		s.t.Fatalf("delivered again %v before the first claim's Until (visibility %v)", claimed.Until().Sub(at), vis)
	}
	if again.Attempts != 2 || string(again.Payload) != "work" {
		s.t.Fatalf("redelivery: %+v, want attempts 2 and the payload", again.Task)
	}
	fa.Heal()
	if err := claimed.Ack(s.ctx); !errors.Is(err, queue.ErrClaimLost) {
		s.t.Errorf("the vanished worker's Ack after the redelivery: %v, want ErrClaimLost", err)
	}
	if err := again.Ack(s.ctx); err != nil {
		s.t.Fatal(err)
	}
	s.noResidue(qa)
}

func testDeadLetter(s *suite) {
	c, _ := s.client()
	q := s.queue(c, &queue.Options{MaxAttempts: 2})
	s.enqueue(q, "bad", &queue.EnqueueOptions{Payload: []byte("x")}, queue.Added)
	for i := range 2 {
		cl := s.claimOne(q, time.Minute)
		if cl.Attempts != i+1 {
			s.t.Fatalf("delivery %d: attempts %d", i+1, cl.Attempts)
		}
		if err := cl.Nack(s.ctx, 0); err != nil {
			s.t.Fatal(err)
		}
	}
	if cs, err := q.Claim(s.ctx, 1, time.Minute); err != nil || len(cs) != 0 {
		s.t.Fatalf("Claim after MaxAttempts deliveries: %v, %v; want none", cs, err)
	}
	st, err := q.Stats(s.ctx)
	if err != nil || st != (queue.Stats{Dead: 1}) {
		s.t.Fatalf("Stats: %+v, %v; want one dead", st, err)
	}
	dead, err := q.Dead(s.ctx, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != "bad" || dead[0].Attempts != 2 || !bytes.Equal(dead[0].Payload, []byte("x")) {
		s.t.Fatalf("Dead: %+v, %v", dead, err)
	}
	if ok, err := q.Requeue(s.ctx, "nosuch", 0); err != nil || ok {
		s.t.Fatalf("Requeue of an unknown id: %v, %v; want false", ok, err)
	}
	if ok, err := q.Requeue(s.ctx, "bad", 0); err != nil || !ok {
		s.t.Fatalf("Requeue: %v, %v", ok, err)
	}
	cl := s.claimOne(q, time.Minute)
	if cl.Attempts != 1 {
		s.t.Fatalf("after Requeue: attempts %d, want 1 (reset)", cl.Attempts)
	}
	// A claim that runs out after the last delivery dead-letters too.
	s.enqueue(q, "slow", nil, queue.Added)
	for range 2 {
		_ = s.claimOne(q, 100*time.Millisecond) // let it run out
	}
	s.eventually(5*time.Second, "the expired last claim dead-lettered", func() bool {
		_, _ = q.Claim(s.ctx, 1, time.Minute) // runs the expiry
		st, err := q.Stats(s.ctx)
		return err == nil && st.Dead == 1
	})
	if err := cl.Ack(s.ctx); err != nil {
		s.t.Fatal(err)
	}
	if ok, err := q.Requeue(s.ctx, "slow", 0); err != nil || !ok {
		s.t.Fatalf("Requeue: %v, %v", ok, err)
	}
	if ts, err := q.Pop(s.ctx, 10); err != nil || len(ts) != 1 {
		s.t.Fatalf("Pop: %v, %v", ts, err)
	}
	s.noResidue(q)
}

func testConcurrentWorkers(s *suite) {
	const tasks, workers = 1000, 6
	p, _ := s.client()
	qp := s.queue(p, nil)
	for i := range tasks {
		s.enqueue(qp, fmt.Sprintf("t%04d", i), &queue.EnqueueOptions{Payload: []byte{byte(i)}}, queue.Added)
	}
	var (
		mu      sync.Mutex
		holding = map[string]int{} // current claims per id
		acked   = map[string]int{}
		left    atomic.Int64
		wg      sync.WaitGroup
		errs    = make(chan error, workers)
	)
	left.Store(tasks)
	start := time.Now()
	for w := range workers {
		c, _ := s.client()
		q := s.same(c, qp, nil)
		wg.Go(func() {
			for left.Load() > 0 && s.ctx.Err() == nil {
				ctx, cancel := context.WithTimeout(s.ctx, 500*time.Millisecond)
				cs, err := q.ClaimWait(ctx, 10, time.Minute)
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				// A claim is current from ClaimWait's return to its Ack.
				mu.Lock()
				for _, cl := range cs {
					if holding[cl.ID]++; holding[cl.ID] > 1 {
						errs <- fmt.Errorf("task %s claimed by two workers at once", cl.ID)
					}
				}
				mu.Unlock()
				for _, cl := range cs {
					if err := cl.Ack(s.ctx); err != nil {
						errs <- fmt.Errorf("worker %d: Ack %s: %w", w, cl.ID, err)
						return
					}
					mu.Lock()
					holding[cl.ID]--
					acked[cl.ID]++
					mu.Unlock()
					left.Add(-1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		s.t.Error(err)
	}
	if s.ctx.Err() != nil {
		s.t.Fatalf("%d of %d tasks not acked in %v", left.Load(), tasks, time.Since(start).Round(time.Second))
	}
	if len(acked) != tasks {
		s.t.Fatalf("%d distinct tasks acked, want %d", len(acked), tasks)
	}
	for id, n := range acked {
		if n != 1 {
			s.t.Errorf("task %s acked %d times", id, n)
		}
	}
	s.noResidue(qp)
}

func testResets(s *suite) {
	const tasks, workers = 200, 3
	// Resets lose replies to claims, which count as deliveries: no
	// dead-lettering here, the property is that nothing is lost.
	opts := &queue.Options{MaxAttempts: 1 << 20}
	p, fp := s.client()
	qp := s.queue(p, opts)
	ctx, cancel := context.WithTimeout(s.ctx, s.live(60*time.Second))
	defer cancel()
	var (
		mu sync.Mutex
		// An Ack whose reply a reset lost may have removed the task: a task
		// is accounted for once an Ack was sent for it; acked counts the
		// Acks known to have succeeded.
		sent     = map[string]bool{}
		acked    int
		produced atomic.Bool
		faults   = []Faults{fp}
		// progress[i] counts the calls of client i (0: the producer)
		// that succeeded: the nemesis resets a client only after it made
		// progress since its previous reset.
		progress = make([]atomic.Int64, workers+1)
		wg       sync.WaitGroup
	)
	for w := range workers {
		c, f := s.client()
		faults = append(faults, f)
		q := s.same(c, qp, opts)
		done := &progress[w+1]
		wg.Go(func() {
			for ctx.Err() == nil {
				wctx, cancel := context.WithTimeout(ctx, time.Second)
				cs, err := q.ClaimWait(wctx, 5, 500*time.Millisecond)
				cancel()
				if err == nil {
					done.Add(1)
				}
				if err != nil || len(cs) == 0 {
					if n, lerr := q.Len(ctx); produced.Load() && lerr == nil && n == 0 {
						return // drained
					}
					continue // a reset or the wait's end: again
				}
				for _, cl := range cs {
					err := cl.Ack(ctx)
					if err == nil {
						done.Add(1)
					}
					mu.Lock()
					sent[cl.ID] = true
					if err == nil {
						acked++
					}
					mu.Unlock()
				}
			}
		})
	}
	stop := make(chan struct{})
	var nemesis sync.WaitGroup
	nemesis.Go(func() {
		// Every 100ms the next client that has made progress since its
		// previous reset has its connections reset: often enough to cut
		// calls in the middle, and never twice before a client has made
		// a new connection and done something with it. (A reset every
		// 400ms per client, whatever happened, kept every client from
		// connecting at all on a loaded machine, where PostgreSQL's
		// handshake took longer than that.)
		seen := make([]int64, len(faults))
		for i := 0; ; {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for range faults {
				i = (i + 1) % len(faults)
				if n := progress[i].Load(); n > seen[i] {
					seen[i] = n
					faults[i].Reset()
					break
				}
			}
		}
	})
	enqueued := 0
	for enqueued < tasks && ctx.Err() == nil {
		if _, err := qp.Enqueue(ctx, fmt.Sprintf("r%03d", enqueued), nil); err != nil {
			continue // reset mid-call: it happened or not; again (deduplicated)
		}
		progress[0].Add(1)
		enqueued++
	}
	produced.Store(true)
	wg.Wait()
	close(stop)
	nemesis.Wait()
	if err := ctx.Err(); err != nil {
		// The producer's pool may still have connections the nemesis
		// reset: a few tries, so that the report says what was left.
		st, serr := qp.Stats(s.ctx)
		for try := 0; serr != nil && try < 5; try++ {
			time.Sleep(100 * time.Millisecond)
			st, serr = qp.Stats(s.ctx)
		}
		mu.Lock()
		n := len(sent)
		mu.Unlock()
		s.t.Fatalf("not drained within %v: %d of %d tasks enqueued, %d acked, %d with an Ack sent; the queue: %+v, %v",
			s.live(60*time.Second), enqueued, tasks, acked, n, st, serr)
	}
	for i := range tasks {
		if id := fmt.Sprintf("r%03d", i); !sent[id] {
			s.t.Errorf("task %s left the queue without an Ack: lost", id)
		}
	}
	s.t.Logf("%d tasks, %d Acks known to succeed (fewer: replies lost to resets; more: an Enqueue retried after a lost reply re-adds a task consumed meanwhile)", tasks, acked)
	s.noResidue(qp)
}

func testWoken(s *suite) {
	c, _ := s.client()
	c2, _ := s.client()
	q := s.queue(c, nil)
	q2 := s.same(c2, q, nil)
	type result struct {
		at  time.Time // when the wait returned
		err error
	}
	for _, kind := range []string{"ClaimWait", "PopWait"} {
		got := make(chan result, 1)
		go func() {
			if kind == "ClaimWait" {
				cs, err := q2.ClaimWait(s.ctx, 1, time.Minute)
				at := time.Now()
				if err == nil && len(cs) == 1 {
					err = cs[0].Ack(s.ctx)
				}
				got <- result{at, err}
				return
			}
			_, err := q2.PopWait(s.ctx, 1)
			got <- result{time.Now(), err}
		}()
		time.Sleep(200 * time.Millisecond) // let it block (no event tells that it has)
		s.enqueue(q, kind, nil, queue.Added)
		// The wake-up follows the Enqueue's commit, which is before its
		// return: counted from there, not from its send (an Enqueue on a
		// loaded machine may take longer than the bound itself).
		enqueued := time.Now()
		select {
		case r := <-got:
			if r.err != nil {
				s.t.Fatalf("%s: %v", kind, r.err)
			}
			// The fallback timer is 5s: well before it, the wake-up came
			// from the server.
			if d := r.at.Sub(enqueued); d > s.live(time.Second) {
				s.t.Errorf("%s returned %v after the enqueue: not woken by it", kind, d)
			}
		case <-s.ctx.Done():
			s.t.Fatalf("%s not woken", kind)
		}
	}
	s.noResidue(q)
}
