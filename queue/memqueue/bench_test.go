package memqueue_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/dlock/dlock/memory"
	"github.com/dlock/dlock/queue"
	"github.com/dlock/dlock/queue/memqueue"
)

// BenchmarkClaimAck claims and acks one task at a time from a queue holding
// n due tasks (refilled as it drains, so the depth stays at n), with as many
// delayed tasks beside them: the cost of one claim+ack at that depth.
func BenchmarkClaimAck(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("queued=%d", n), func(b *testing.B) {
			ctx := context.Background()
			q, err := memqueue.NewQueue(memory.NewStore(), nil).Queue("bench", nil)
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				mustEnqueue(b, q, "due-"+strconv.Itoa(i), nil)
				mustEnqueue(b, q, "later-"+strconv.Itoa(i), &queue.EnqueueOptions{Delay: time.Hour})
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				claims, err := q.Claim(ctx, 1, time.Minute)
				if err != nil || len(claims) != 1 {
					b.Fatalf("claim: %d claims, %v", len(claims), err)
				}
				if err := claims[0].Ack(ctx); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				mustEnqueue(b, q, "more-"+strconv.Itoa(i), nil)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkPop pops one task at a time from a queue holding n due tasks,
// refilled as it drains.
func BenchmarkPop(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("queued=%d", n), func(b *testing.B) {
			ctx := context.Background()
			q, err := memqueue.NewQueue(memory.NewStore(), nil).Queue("bench", nil)
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				mustEnqueue(b, q, "due-"+strconv.Itoa(i), nil)
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				tasks, err := q.Pop(ctx, 1)
				if err != nil || len(tasks) != 1 {
					b.Fatalf("pop: %d tasks, %v", len(tasks), err)
				}
				b.StopTimer()
				mustEnqueue(b, q, "more-"+strconv.Itoa(i), nil)
				b.StartTimer()
			}
		})
	}
}

func mustEnqueue(b *testing.B, q *queue.Queue, id string, opts *queue.EnqueueOptions) {
	if _, err := q.Enqueue(context.Background(), id, opts); err != nil {
		b.Fatal(err)
	}
}
