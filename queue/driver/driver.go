package driver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strconv"
	"time"

	"github.com/dlock/dlock/internal/registry"
)

// Task is a queued task as a driver returns it.
type Task struct {
	ID       string
	Due      time.Time // when it is (or was) due, on the server's clock, to the millisecond (rounded up)
	Payload  []byte
	Attempts int // deliveries by Claim so far
}

// Claimed is a task taken by Claim: Token identifies this claim for Ack,
// Extend and Nack.
type Claimed struct {
	Task
	Token string
}

// Mode says what Enqueue does with an id already queued.
type Mode uint8

const (
	Keep       Mode = iota // leave it as it is (deduplication)
	Replace                // give it the new payload and due time
	Reschedule             // give it the new due time, keep its payload
)

// Result says what Enqueue did.
type Result uint8

const (
	Added       Result = iota + 1 // a new task
	Kept                          // the id was queued already and is unchanged
	Replaced                      // the id was queued; payload and due time replaced
	Rescheduled                   // the id was queued; due time replaced
)

// String is the result in a word: "added", "kept", "replaced",
// "rescheduled".
func (r Result) String() string {
	switch r {
	case Added:
		return "added"
	case Kept:
		return "kept"
	case Replaced:
		return "replaced"
	case Rescheduled:
		return "rescheduled"
	}
	return "Result(" + strconv.Itoa(int(r)) + ")"
}

// EnqueueRequest is one Enqueue. The task is due at At, or, when At is
// zero, Delay after the server's now.
type EnqueueRequest struct {
	ID      string
	Delay   time.Duration
	At      time.Time
	Payload []byte
	Mode    Mode
}

// Stats counts a queue's tasks. An expired claim counts as due.
type Stats struct {
	Due     int64 // due now, not claimed
	Delayed int64 // due later
	Claimed int64 // under a current claim
	Dead    int64 // dead-lettered
}

// Driver is one task-queue backend. Its methods are called concurrently,
// with validated arguments, and must be atomic on the server.
type Driver interface {
	// Enqueue adds a task, or does what Mode says with an id already
	// queued (due, delayed or claimed: a Replace or Reschedule of a claimed
	// task ends its claim). An id in the dead-letter set is added anew.
	Enqueue(ctx context.Context, queue string, r EnqueueRequest) (Result, error)
	// Peek returns up to n due tasks, in due order, taking none.
	Peek(ctx context.Context, queue string, n int) ([]Task, error)
	// Pop removes and returns up to n due tasks, in due order. wait is how
	// long until the next task is due (negative when none is queued), on
	// the server's clock.
	Pop(ctx context.Context, queue string, n int) (tasks []Task, wait time.Duration, err error)
	// Claim takes up to n due tasks for visibility: each gets a new token
	// and its Attempts raised. Tasks whose claim has expired are due again
	// (at their claim's expiry) first, or dead-lettered when they have had
	// maxAttempts deliveries. wait is as for Pop, counting claims' expiries.
	Claim(ctx context.Context, queue string, n int, visibility time.Duration, maxAttempts int) (claims []Claimed, wait time.Duration, err error)
	// Ack removes the task if token's claim on it is current (not expired,
	// not replaced); it reports whether it did.
	Ack(ctx context.Context, queue, id, token string) (bool, error)
	// Extend makes a current claim last d from now.
	Extend(ctx context.Context, queue, id, token string, d time.Duration) (bool, error)
	// Nack ends a current claim: the task is due again after delay, or
	// dead-lettered when it has had maxAttempts deliveries.
	Nack(ctx context.Context, queue, id, token string, delay time.Duration, maxAttempts int) (bool, error)
	// Delete removes a task that is not claimed if it is still due at due
	// (a compare-and-remove: a task enqueued again meanwhile stays).
	Delete(ctx context.Context, queue, id string, due time.Time) (bool, error)
	// Stats counts the queue's tasks.
	Stats(ctx context.Context, queue string) (Stats, error)
	// Dead returns up to n dead-lettered tasks, oldest death first.
	Dead(ctx context.Context, queue string, n int) ([]Task, error)
	// Requeue moves a dead-lettered task back, due after delay, with its
	// attempts reset.
	Requeue(ctx context.Context, queue, id string, delay time.Duration) (bool, error)
	// Watch returns a channel that receives (1-buffered) when a task may
	// have become due sooner than the last wait said: an Enqueue, Nack or
	// Requeue on the queue, by any client. It returns once the subscription
	// is in place. stop ends it.
	Watch(ctx context.Context, queue string) (c <-chan struct{}, stop func(), err error)
	// Close releases the driver's own resources (not the application's
	// client).
	Close() error
}

// Pinger is implemented by drivers that connect when opened from a URL;
// queue.Open calls it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// OpenFunc opens a driver from a URL of a registered scheme.
type OpenFunc func(ctx context.Context, u *url.URL) (Driver, error)

// Register makes queue.Open use open for URLs of the scheme; drivers call
// it from init. The registry is dlock's own (one for locks and queues,
// each scheme once per kind): a scheme may name a lock driver and a queue
// driver. It panics on a nil open or a scheme registered twice.
func Register(scheme string, open OpenFunc) {
	registry.Register(registry.Queue, scheme, open, open == nil)
}

// Lookup returns the OpenFunc of the scheme, or nil.
func Lookup(scheme string) OpenFunc {
	open, _ := registry.Lookup(registry.Queue, scheme).(OpenFunc)
	return open
}

// Schemes lists the registered schemes, sorted.
func Schemes() []string { return registry.Schemes(registry.Queue) }

// Millis returns d in whole milliseconds, rounded up: the duration a
// driver sends a server that counts in milliseconds.
func Millis(d time.Duration) int64 {
	ms := d / time.Millisecond
	if d%time.Millisecond > 0 {
		ms++
	}
	return int64(ms)
}

// UpMilli returns t rounded up to the millisecond: the due time a driver
// stores for a task due at t.
func UpMilli(t time.Time) time.Time {
	if r := t.Sub(t.Truncate(time.Millisecond)); r > 0 {
		return t.Add(time.Millisecond - r)
	}
	return t
}

// NewToken returns a claim token: 128 random bits in hex.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
