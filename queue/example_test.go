package queue_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dlock/dlock/queue"
)

import _ "github.com/dlock/dlock/queue/memqueue" // mem://; queue/redisqueue for redis://, queue/pgqueue for postgres://

// Enqueue an order and a reminder due later, then claim what is due: the
// order. The README's queue snippet is this example's body.
func Example() {
	ctx := context.Background()
	c, err := queue.Open(ctx, "mem://shop") // or redisqueue.NewQueue / pgqueue.NewQueue on a client you have
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	orders, _ := c.Queue("orders", nil)
	res, _ := orders.Enqueue(ctx, "order-42", &queue.EnqueueOptions{Payload: []byte("2 teas")})
	fmt.Println(res) // added (enqueued again before it is acked: kept)

	// A reminder due in an hour, which ClaimWait does not wait for.
	orders.Enqueue(ctx, "reminder-42", &queue.EnqueueOptions{Delay: time.Hour})
	claims, _ := orders.ClaimWait(ctx, 10, 30*time.Second) // waits until a task is due
	for _, cl := range claims {
		process(cl.ID, cl.Payload)
		cl.Ack(ctx) // ErrClaimLost if the claim ran out: the task is delivered again
	}
	// Output:
	// added
	// order-42 2 teas
}

func process(id string, payload []byte) { fmt.Println(id, string(payload)) }

func ExampleEnqueueResult() {
	for _, r := range []queue.EnqueueResult{queue.Added, queue.Kept, queue.Replaced, queue.Rescheduled} {
		fmt.Println(r)
	}
	// Output:
	// added
	// kept
	// replaced
	// rescheduled
}
