package redisqueue_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/queue"
	"github.com/dlock/dlock/queue/redisqueue"
	"github.com/dlock/dlock/tests/internal/testutil"
	goredis "github.com/redis/go-redis/v9"
)

// claimCounter is a go-redis hook counting the queue's claim scripts sent
// on a client (tasks_take.lua with ARGV[1] "claim"), and telling each on
// claimed once its reply is in.
type claimCounter struct {
	n       atomic.Int64
	claimed chan struct{} // 1-buffered
}

func newClaimCounter() *claimCounter { return &claimCounter{claimed: make(chan struct{}, 1)} }

func (h *claimCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *claimCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (h *claimCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		// EVALSHA/EVAL sha-or-script numkeys key... arg...
		a := cmd.Args()
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && len(a) > 3 {
			if k, ok := a[2].(int); ok && len(a) > 3+k && a[3+k] == "claim" {
				h.n.Add(1)
				select {
				case h.claimed <- struct{}{}:
				default:
				}
			}
		}
		return err
	}
}

// queueClient returns a queue Client on its own go-redis client, with
// hooks added; both are closed at cleanup.
func queueClient(t *testing.T, addr string, hooks ...goredis.Hook) *queue.Client {
	t.Helper()
	rc := newClient(t, addr)
	for _, h := range hooks {
		rc.AddHook(h)
	}
	c, err := redisqueue.NewQueue(rc, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Changes publish a wake-up only while some Client waits on the queue:
// none before the first waiter, and none once its Client closed.
func TestPublishOnlyWhileWaiting(t *testing.T) {
	addr := redisAddr(t)
	ctx := testutil.Ctx(t)
	name := "wake-" + testutil.RandomHex(4)
	channel := redisqueue.DefaultQueuePrefix + "{" + name + "}:due:ready"
	raw := newClient(t, addr)
	sub := raw.Subscribe(ctx, channel)
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	// wakeUps publishes mark and returns how many wake-ups the channel
	// carried before it (pub/sub keeps a connection's order).
	wakeUps := func(mark string) int {
		t.Helper()
		if err := raw.Publish(ctx, channel, mark).Err(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := sub.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if m.Payload == mark {
				return n
			}
			n++
		}
	}
	p, err := queueClient(t, addr).Queue(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			if _, err := p.Enqueue(ctx, fmt.Sprint(prefix, i), nil); err != nil {
				t.Fatal(err)
			}
		}
	}

	enqueue("before", 5)
	if n := wakeUps("mark1"); n != 0 {
		t.Errorf("%d wake-ups published with no one waiting, want 0", n)
	}
	if _, err := p.Pop(ctx, queue.MaxBatch); err != nil {
		t.Fatal(err)
	}

	hook := newClaimCounter()
	wc := queueClient(t, addr, hook)
	w, err := wc.Queue(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		cs, err := w.ClaimWait(ctx, 1, time.Minute)
		if err == nil && len(cs) == 1 {
			err = cs[0].Ack(ctx)
		}
		got <- err
	}()
	<-hook.claimed // its first Claim found nothing: the waiter is entered
	enqueue("during", 1)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := wakeUps("mark2"); n != 1 {
		t.Errorf("%d wake-ups published for one task with a waiter, want 1", n)
	}

	if err := wc.Close(); err != nil {
		t.Fatal(err)
	}
	enqueue("after", 5)
	if n := wakeUps("mark3"); n != 0 {
		t.Errorf("%d wake-ups published after the waiting Client closed, want 0", n)
	}
	if _, err := p.Pop(ctx, queue.MaxBatch); err != nil {
		t.Fatal(err)
	}
}

// Eight idle waiters of one Client, tasks enqueued one at a time: each
// task wakes one waiter, so two or three Claims run per task (waking them
// all ran nine).
func TestOneWaiterWokenPerTask(t *testing.T) {
	const workers, tasks = 8, 30
	addr := redisAddr(t)
	ctx := testutil.Ctx(t)
	name := "wake1-" + testutil.RandomHex(4)
	p, err := queueClient(t, addr).Queue(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	hook := newClaimCounter()
	w, err := queueClient(t, addr, hook).Queue(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	started := make(chan string, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				cs, err := w.ClaimWait(wctx, 1, time.Minute)
				if err != nil {
					return
				}
				for _, c := range cs {
					if err := c.Ack(wctx); err != nil {
						return
					}
					started <- c.ID
				}
			}
		})
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	for hook.n.Load() < workers { // every waiter's first Claim found nothing
		select {
		case <-hook.claimed:
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	c0, t0 := hook.n.Load(), time.Now()
	for i := range tasks {
		if _, err := p.Enqueue(ctx, fmt.Sprint("t", i), nil); err != nil {
			t.Fatal(err)
		}
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatalf("task %d not claimed: %v", i, ctx.Err())
		}
	}
	claims := hook.n.Load() - c0
	// A woken waiter that took a task looks once more when it waits
	// again, and may be woken for the next task while it looks; each
	// waiter also looks by itself every 5s (package queue's longest wait).
	allowed := int64(3*tasks) + workers*int64(time.Since(t0)/(5*time.Second)+1)
	t.Logf("%d tasks, %d Claims (%.2f a task) in %v", tasks, claims, float64(claims)/tasks, time.Since(t0).Round(time.Millisecond))
	if claims > allowed {
		t.Errorf("%d Claims for %d tasks, want at most %d: more than one waiter woken per task", claims, tasks, allowed)
	}
}
