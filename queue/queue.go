package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/queue/driver"
)

// Errors; match them with errors.Is.
var (
	// ErrInvalid: bad input, reported before any I/O (dlock.ErrInvalid).
	ErrInvalid = dlock.ErrInvalid
	// ErrClosed: the Client was closed (dlock.ErrClosed).
	ErrClosed = dlock.ErrClosed
	// ErrClaimLost: the claim is no longer current (it expired, was acked
	// or nacked, or the task was enqueued again with Replace or
	// Reschedule): Ack, Extend and Nack changed nothing.
	ErrClaimLost = errors.New("queue: the claim is no longer current")
)

// Limits.
const (
	// MaxPayload is the largest payload a task may carry: 1 MiB.
	MaxPayload = 1 << 20
	// MaxBatch is the most tasks one Peek, Pop, Claim or Dead returns.
	MaxBatch = 1000
	// DefaultMaxAttempts is Options.MaxAttempts' default.
	DefaultMaxAttempts = 5
)

// Client is a connection to a queue backend. It is safe for concurrent use.
type Client struct {
	d driver.Driver

	mu     sync.Mutex
	closed bool
}

// Open connects to the queue backend a URL names: redis:// and rediss://
// (package dlock/queue/redisqueue), postgres:// and postgresql://
// (dlock/queue/pgqueue), mem:// (dlock/queue/memqueue), mysql://
// (dlock/mysql/mysqlqueue, in the module dlock/mysql); import the driver's
// package for its scheme to be known. ctx bounds connecting.
func Open(ctx context.Context, rawURL string) (*Client, error) {
	u, err := dlockdriver.ParseURL(rawURL) // its errors quote nothing of the URL
	if err != nil {
		return nil, err
	}
	open := driver.Lookup(u.Scheme)
	if open == nil {
		return nil, fmt.Errorf("%w: no queue driver for scheme %q (forgotten import?); registered: %s",
			ErrInvalid, u.Scheme, strings.Join(driver.Schemes(), ", "))
	}
	d, err := open(ctx, u)
	if err != nil {
		return nil, dlockdriver.RedactError(err, u)
	}
	if p, ok := d.(driver.Pinger); ok {
		if err := p.Ping(ctx); err != nil {
			_ = d.Close()
			return nil, dlockdriver.RedactError(err, u)
		}
	}
	return New(d), nil
}

// New returns a Client on a driver; drivers' constructors call it.
func New(d driver.Driver) *Client { return &Client{d: d} }

// Close closes the driver's own connections; tasks stay queued.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	return c.d.Close()
}

func (c *Client) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return nil
}

// Options configure a Queue. A nil *Options means all defaults.
type Options struct {
	// MaxAttempts is how many deliveries by Claim a task gets: one whose
	// claim expires or is nacked after that many is dead-lettered. Default
	// DefaultMaxAttempts (5).
	MaxAttempts int
}

// Queue is one named queue of a Client: a cheap handle, safe for concurrent
// use.
type Queue struct {
	c    *Client
	name string
	max  int
}

// Queue returns the queue of that name (validated as dlock lock names are).
func (c *Client) Queue(name string, opts *Options) (*Queue, error) {
	if err := dlock.ValidateName(name); err != nil {
		return nil, fmt.Errorf("queue name: %w", err)
	}
	q := &Queue{c: c, name: name, max: DefaultMaxAttempts}
	if opts != nil && opts.MaxAttempts != 0 {
		if opts.MaxAttempts < 0 {
			return nil, fmt.Errorf("%w: queue: negative MaxAttempts %d", ErrInvalid, opts.MaxAttempts)
		}
		q.max = opts.MaxAttempts
	}
	return q, nil
}

// Name is the queue's name.
func (q *Queue) Name() string { return q.name }

// Task is a queued task.
type Task struct {
	ID string
	// Due is when the task is (or was) due, on the server's clock, to the
	// millisecond (rounded up: a task enqueued with a Delay is due no
	// sooner than the enqueue's send time + Delay).
	Due     time.Time
	Payload []byte
	// Attempts counts its deliveries by Claim, this one included.
	Attempts int
}

// EnqueueOptions say when a task is due and what to do if its id is
// queued already. A nil *EnqueueOptions means: due now, no payload, keep.
type EnqueueOptions struct {
	// Delay makes the task due that long after now (the server's clock).
	Delay time.Duration
	// At, when not zero, is when the task is due (instead of Delay).
	At time.Time
	// Payload is the task's data, at most MaxPayload bytes.
	Payload []byte
	// Replace gives an id already queued this payload and due time;
	// Reschedule gives it this due time and keeps its payload. Otherwise
	// the queued task stays as it is (deduplication). Either ends a
	// current claim on the task.
	Replace, Reschedule bool
}

// EnqueueResult says what Enqueue did.
type EnqueueResult = driver.Result

// The results of Enqueue.
const (
	Added       = driver.Added
	Kept        = driver.Kept
	Replaced    = driver.Replaced
	Rescheduled = driver.Rescheduled
)

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: queue: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// Enqueue adds the task id, or, if id is queued already (due, delayed or
// claimed), leaves it as it is unless opts ask to replace or reschedule it.
func (q *Queue) Enqueue(ctx context.Context, id string, opts *EnqueueOptions) (EnqueueResult, error) {
	var o EnqueueOptions
	if opts != nil {
		o = *opts
	}
	switch err := dlock.ValidateName(id); {
	case err != nil:
		return 0, fmt.Errorf("task id: %w", err)
	case o.Delay < 0:
		return 0, invalid("negative delay %v", o.Delay)
	case len(o.Payload) > MaxPayload:
		return 0, invalid("payload of %d bytes is over MaxPayload (%d)", len(o.Payload), MaxPayload)
	case o.Replace && o.Reschedule:
		return 0, invalid("Replace and Reschedule exclude each other")
	case !o.At.IsZero() && o.Delay != 0:
		return 0, invalid("At and Delay exclude each other")
	}
	if err := q.c.check(); err != nil {
		return 0, err
	}
	mode := driver.Keep
	switch {
	case o.Replace:
		mode = driver.Replace
	case o.Reschedule:
		mode = driver.Reschedule
	}
	return q.c.d.Enqueue(ctx, q.name, driver.EnqueueRequest{ID: id, Delay: o.Delay, At: o.At, Payload: o.Payload, Mode: mode})
}

func checkN(n int) error {
	if n <= 0 || n > MaxBatch {
		return invalid("n = %d, want 1 to %d", n, MaxBatch)
	}
	return nil
}

func tasks(ts []driver.Task) []Task {
	out := make([]Task, len(ts))
	for i, t := range ts {
		out[i] = Task(t)
	}
	return out
}

// Peek returns up to n due tasks in due order without taking them.
func (q *Queue) Peek(ctx context.Context, n int) ([]Task, error) {
	if err := checkN(n); err != nil {
		return nil, err
	}
	if err := q.c.check(); err != nil {
		return nil, err
	}
	ts, err := q.c.d.Peek(ctx, q.name, n)
	return tasks(ts), err
}

// Pop removes and returns up to n due tasks, in due order, at once: at most
// once delivery (a task popped by a worker that then crashes is gone). It
// returns no task, and no error, when none is due.
func (q *Queue) Pop(ctx context.Context, n int) ([]Task, error) {
	if err := checkN(n); err != nil {
		return nil, err
	}
	if err := q.c.check(); err != nil {
		return nil, err
	}
	ts, _, err := q.c.d.Pop(ctx, q.name, n)
	return tasks(ts), err
}

// PopWait is Pop that waits until at least one task is due or ctx ends
// (then it returns ctx's error). It is woken by the server when a task is
// enqueued and by a timer when the next one becomes due: it does not poll.
func (q *Queue) PopWait(ctx context.Context, n int) ([]Task, error) {
	if err := checkN(n); err != nil {
		return nil, err
	}
	var out []Task
	err := q.wait(ctx, func() (time.Duration, bool, error) {
		ts, wait, err := q.c.d.Pop(ctx, q.name, n)
		out = tasks(ts)
		return wait, len(ts) > 0, err
	})
	return out, err
}

// Claim takes up to n due tasks for visibility: each comes as a *Claim,
// which Ack, Extend and Nack act on. A task whose claim runs out is due
// again and is delivered to the next Claim, with Attempts raised; after
// Options.MaxAttempts deliveries it is dead-lettered instead. No two
// claims on a task are current at once. It returns no task, and no error,
// when none is due.
func (q *Queue) Claim(ctx context.Context, n int, visibility time.Duration) ([]*Claim, error) {
	if err := checkClaim(n, visibility); err != nil {
		return nil, err
	}
	if err := q.c.check(); err != nil {
		return nil, err
	}
	cs, _, err := q.claim(ctx, n, visibility)
	return cs, err
}

// ClaimWait is Claim that waits until at least one task can be claimed or
// ctx ends (then it returns ctx's error), woken as PopWait is.
func (q *Queue) ClaimWait(ctx context.Context, n int, visibility time.Duration) ([]*Claim, error) {
	if err := checkClaim(n, visibility); err != nil {
		return nil, err
	}
	var out []*Claim
	err := q.wait(ctx, func() (time.Duration, bool, error) {
		cs, wait, err := q.claim(ctx, n, visibility)
		out = cs
		return wait, len(cs) > 0, err
	})
	return out, err
}

func checkClaim(n int, visibility time.Duration) error {
	if err := checkN(n); err != nil {
		return err
	}
	if visibility <= 0 {
		return invalid("visibility %v, want a positive duration", visibility)
	}
	return nil
}

func (q *Queue) claim(ctx context.Context, n int, visibility time.Duration) ([]*Claim, time.Duration, error) {
	sent := time.Now()
	cs, wait, err := q.c.d.Claim(ctx, q.name, n, visibility, q.max)
	if err != nil {
		return nil, wait, err
	}
	out := make([]*Claim, len(cs))
	for i, c := range cs {
		out[i] = &Claim{Task: Task(c.Task), q: q, token: c.Token, until: until(sent, visibility)}
	}
	return out, wait, nil
}

// until is a claim's Until: counted from sent, read before the request was
// sent, with the visibility rounded down to the millisecond. The server
// counts its deadline from its now (later than sent) rounded up, with the
// visibility rounded up (see package queue/driver's Rounding), so its
// deadline is never earlier, and no other client can claim the task
// before Until.
func until(sent time.Time, visibility time.Duration) time.Time {
	return sent.Add(visibility.Truncate(time.Millisecond))
}

// maxWait bounds one wait between attempts when the server names no next
// due time: a lost wake-up costs at most this.
const maxWait = 5 * time.Second

// wait runs attempt until it has something, waking on the queue's watch
// (set up before the first attempt, so that an enqueue after it is never
// missed) or at the next due time the attempt reported.
func (q *Queue) wait(ctx context.Context, attempt func() (time.Duration, bool, error)) error {
	if err := q.c.check(); err != nil {
		return err
	}
	wake, stop, err := q.c.d.Watch(ctx, q.name)
	if err != nil {
		return err
	}
	defer stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait, ok, err := attempt()
		if err != nil || ok {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if wait < 0 || wait > maxWait {
			wait = maxWait
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		case <-timer.C:
		}
	}
}

// Claim is a worker's hold on a claimed task.
type Claim struct {
	Task
	q     *Queue
	token string

	mu    sync.Mutex
	until time.Time
}

// Until is when the claim runs out unless extended, on this process's
// clock: counted from before the Claim (or Extend) request was sent, with
// the visibility rounded down to the millisecond, while the server counts
// from its receipt and rounds up, so the server's deadline is no earlier
// and no other client claims the task before Until.
func (c *Claim) Until() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.until
}

// Ack removes the task if this claim is still current; otherwise it
// changes nothing and returns
// ErrClaimLost: the task has been or will be delivered again.
func (c *Claim) Ack(ctx context.Context) error {
	if err := c.q.c.check(); err != nil {
		return err
	}
	ok, err := c.q.c.d.Ack(ctx, c.q.name, c.ID, c.token)
	return lost(ok, err, c.ID)
}

// Extend makes the claim last d from now, if it is still current.
func (c *Claim) Extend(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return invalid("extension %v, want a positive duration", d)
	}
	if err := c.q.c.check(); err != nil {
		return err
	}
	sent := time.Now()
	ok, err := c.q.c.d.Extend(ctx, c.q.name, c.ID, c.token, d)
	if err = lost(ok, err, c.ID); err == nil {
		c.mu.Lock()
		c.until = until(sent, d)
		c.mu.Unlock()
	}
	return err
}

// Nack gives the task back, due again after delay (or dead-lettered if it
// has had its MaxAttempts deliveries), if this claim is still current.
func (c *Claim) Nack(ctx context.Context, delay time.Duration) error {
	if delay < 0 {
		return invalid("negative delay %v", delay)
	}
	if err := c.q.c.check(); err != nil {
		return err
	}
	ok, err := c.q.c.d.Nack(ctx, c.q.name, c.ID, c.token, delay, c.q.max)
	return lost(ok, err, c.ID)
}

func lost(ok bool, err error, id string) error {
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%w: task %q", ErrClaimLost, id)
	}
	return nil
}

// Delete removes the task id if it is not claimed and is still due at due
// (as Peek or a Task returned it): a compare-and-remove, which leaves a
// task that was enqueued again meanwhile. It reports whether it
// removed it.
func (q *Queue) Delete(ctx context.Context, id string, due time.Time) (bool, error) {
	if err := dlock.ValidateName(id); err != nil {
		return false, fmt.Errorf("task id: %w", err)
	}
	if err := q.c.check(); err != nil {
		return false, err
	}
	return q.c.d.Delete(ctx, q.name, id, due)
}

// Stats counts the queue's tasks: due, delayed, claimed and dead.
type Stats = driver.Stats

// Stats counts the queue's tasks.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	if err := q.c.check(); err != nil {
		return Stats{}, err
	}
	return q.c.d.Stats(ctx, q.name)
}

// Len is the number of tasks queued: due, delayed and claimed (not dead).
func (q *Queue) Len(ctx context.Context) (int64, error) {
	s, err := q.Stats(ctx)
	return s.Due + s.Delayed + s.Claimed, err
}

// Dead returns up to n dead-lettered tasks, oldest death first.
func (q *Queue) Dead(ctx context.Context, n int) ([]Task, error) {
	if err := checkN(n); err != nil {
		return nil, err
	}
	if err := q.c.check(); err != nil {
		return nil, err
	}
	ts, err := q.c.d.Dead(ctx, q.name, n)
	return tasks(ts), err
}

// Requeue moves the dead-lettered task id back into the queue, due after
// delay, with its attempts reset; it reports whether id was dead.
func (q *Queue) Requeue(ctx context.Context, id string, delay time.Duration) (bool, error) {
	if err := dlock.ValidateName(id); err != nil {
		return false, fmt.Errorf("task id: %w", err)
	}
	if delay < 0 {
		return false, invalid("negative delay %v", delay)
	}
	if err := q.c.check(); err != nil {
		return false, err
	}
	return q.c.d.Requeue(ctx, q.name, id, delay)
}
