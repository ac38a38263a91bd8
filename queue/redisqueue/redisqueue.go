package redisqueue

import (
	"context"
	_ "embed"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/redisclient"
	"github.com/dlock/dlock/internal/redishub"
	"github.com/dlock/dlock/queue"
	qdriver "github.com/dlock/dlock/queue/driver"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

func init() {
	qdriver.Register("redis", openTasks)
	qdriver.Register("rediss", openTasks)
}

var (
	//go:embed tasks_common.lua
	tasksCommon string
	//go:embed tasks_enqueue.lua
	tasksEnqueueLua string
	//go:embed tasks_take.lua
	tasksTakeLua string
	//go:embed tasks_settle.lua
	tasksSettleLua string
	//go:embed tasks_admin.lua
	tasksAdminLua string

	tasksEnqueue = goredis.NewScript(tasksCommon + tasksEnqueueLua)
	tasksTake    = goredis.NewScript(tasksCommon + tasksTakeLua)
	tasksSettle  = goredis.NewScript(tasksCommon + tasksSettleLua)
	tasksAdmin   = goredis.NewScript(tasksCommon + tasksAdminLua)
)

// DefaultQueuePrefix begins every task-queue key (QueueOptions.KeyPrefix).
const DefaultQueuePrefix = "dlockq:"

// QueueOptions configure a task-queue Client.
type QueueOptions struct {
	// KeyPrefix begins every key (URL: prefix). Default DefaultQueuePrefix.
	KeyPrefix string
}

// NewQueue returns a task-queue Client (package queue) on the
// application's client: a *goredis.Client (one server, or Sentinel's
// FailoverClient) or a *goredis.ClusterClient, with ContextTimeoutEnabled.
// Every operation is one Lua script on the queue's hash slot. Closing the
// Client does not close the application's client.
func NewQueue(client goredis.UniversalClient, opts *QueueOptions) (*queue.Client, error) {
	if err := redisclient.Check(client); err != nil {
		return nil, err
	}
	return queue.New(newTaskDriver(client, opts, false)), nil
}

// openTasks is the OpenFunc of redis:// and rediss:// queue URLs: the lock
// URL's form and parameters (prefix, TLS, go-redis's own); lock options
// are accepted and ignored.
func openTasks(ctx context.Context, u *url.URL) (qdriver.Driver, error) {
	gopts, opts, err := redis.ParseURL(u)
	if err != nil {
		return nil, err
	}
	if opts.Compat {
		return nil, fmt.Errorf("%w: redis: compat=true is a lock layout; task queues have one layout", dlock.ErrInvalid)
	}
	client := goredis.NewClient(gopts)
	return newTaskDriver(client, &QueueOptions{KeyPrefix: opts.KeyPrefix}, true), nil
}

func newTaskDriver(client goredis.UniversalClient, opts *QueueOptions, owns bool) *taskDriver {
	d := &taskDriver{c: client, prefix: DefaultQueuePrefix, owns: owns}
	if opts != nil && opts.KeyPrefix != "" {
		d.prefix = opts.KeyPrefix
	}
	d.hub = redishub.New(client, "redis", nil)
	return d
}

// taskDriver is the redis task-queue driver; see tasks_common.lua for the
// layout.
type taskDriver struct {
	c      goredis.UniversalClient
	prefix string
	owns   bool
	hub    *redishub.Hub
}

func (d *taskDriver) keys(q string) []string {
	k := d.prefix + "{" + q + "}:"
	return []string{k + "due", k + "claimed", k + "dead", k + "payload", k + "info"}
}

func (d *taskDriver) Ping(ctx context.Context) error {
	if err := d.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: connecting: %w", err)
	}
	return nil
}

// ms is a duration as the scripts take it: whole ms, rounded up (see
// package queue/driver's Rounding).
func ms(d time.Duration) int64 { return qdriver.Millis(d) }

func (d *taskDriver) Enqueue(ctx context.Context, q string, r qdriver.EnqueueRequest) (qdriver.Result, error) {
	at := ""
	if !r.At.IsZero() {
		at = strconv.FormatInt(qdriver.UpMilli(r.At).UnixMilli(), 10)
	}
	v, err := tasksEnqueue.Run(ctx, d.c, d.keys(q), r.ID, ms(r.Delay), at, r.Payload, int(r.Mode)).Int()
	if err != nil {
		return 0, fmt.Errorf("redis: enqueue on %q: %w", q, err)
	}
	return qdriver.Result(v), nil
}

// tasks decodes the {id, due, attempts, payload, token} groups of a reply.
func tasks(v []any) ([]qdriver.Claimed, error) {
	if len(v)%5 != 0 {
		return nil, fmt.Errorf("redis: unexpected reply of %d elements", len(v))
	}
	out := make([]qdriver.Claimed, 0, len(v)/5)
	for i := 0; i < len(v); i += 5 {
		id, _ := v[i].(string)
		dueS, _ := v[i+1].(string)
		due, _ := strconv.ParseInt(dueS, 10, 64)
		a, _ := v[i+2].(int64)
		payload, _ := v[i+3].(string)
		tok, _ := v[i+4].(string)
		out = append(out, qdriver.Claimed{Task: qdriver.Task{ID: id, Due: time.UnixMilli(due), Payload: []byte(payload), Attempts: int(a)}, Token: tok})
	}
	return out, nil
}

func (d *taskDriver) take(ctx context.Context, q, op string, n int, vis time.Duration, max int) ([]qdriver.Claimed, time.Duration, error) {
	v, err := tasksTake.Run(ctx, d.c, d.keys(q), op, n, ms(vis), max, qdriver.NewToken()).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("redis: %s on %q: %w", op, q, err)
	}
	if len(v) == 0 {
		return nil, 0, fmt.Errorf("redis: %s on %q: empty reply", op, q)
	}
	w, _ := v[0].(int64)
	cs, err := tasks(v[1:])
	return cs, time.Duration(w) * time.Millisecond, err
}

func plain(cs []qdriver.Claimed) []qdriver.Task {
	out := make([]qdriver.Task, len(cs))
	for i, c := range cs {
		out[i] = c.Task
	}
	return out
}

func (d *taskDriver) Peek(ctx context.Context, q string, n int) ([]qdriver.Task, error) {
	cs, _, err := d.take(ctx, q, "peek", n, 0, 0)
	return plain(cs), err
}

func (d *taskDriver) Pop(ctx context.Context, q string, n int) ([]qdriver.Task, time.Duration, error) {
	cs, w, err := d.take(ctx, q, "pop", n, 0, 0)
	return plain(cs), w, err
}

func (d *taskDriver) Claim(ctx context.Context, q string, n int, vis time.Duration, max int) ([]qdriver.Claimed, time.Duration, error) {
	return d.take(ctx, q, "claim", n, vis, max)
}

func (d *taskDriver) settle(ctx context.Context, q, op, id, token string, dur time.Duration, max int) (bool, error) {
	v, err := tasksSettle.Run(ctx, d.c, d.keys(q), op, id, token, ms(dur), max).Int()
	if err != nil {
		return false, fmt.Errorf("redis: %s of %q on %q: %w", op, id, q, err)
	}
	return v == 1, nil
}

func (d *taskDriver) Ack(ctx context.Context, q, id, token string) (bool, error) {
	return d.settle(ctx, q, "ack", id, token, 0, 0)
}

func (d *taskDriver) Extend(ctx context.Context, q, id, token string, dur time.Duration) (bool, error) {
	return d.settle(ctx, q, "extend", id, token, dur, 0)
}

func (d *taskDriver) Nack(ctx context.Context, q, id, token string, delay time.Duration, max int) (bool, error) {
	return d.settle(ctx, q, "nack", id, token, delay, max)
}

func (d *taskDriver) admin(ctx context.Context, q string, args ...any) *goredis.Cmd {
	return tasksAdmin.Run(ctx, d.c, d.keys(q), args...)
}

func (d *taskDriver) Delete(ctx context.Context, q, id string, due time.Time) (bool, error) {
	v, err := d.admin(ctx, q, "delete", id, qdriver.UpMilli(due).UnixMilli()).Int()
	if err != nil {
		return false, fmt.Errorf("redis: delete of %q on %q: %w", id, q, err)
	}
	return v == 1, nil
}

func (d *taskDriver) Stats(ctx context.Context, q string) (qdriver.Stats, error) {
	v, err := d.admin(ctx, q, "stats").Int64Slice()
	if err != nil || len(v) != 4 {
		return qdriver.Stats{}, fmt.Errorf("redis: stats of %q: %v %w", q, v, err)
	}
	return qdriver.Stats{Due: v[0], Delayed: v[1], Claimed: v[2], Dead: v[3]}, nil
}

func (d *taskDriver) Dead(ctx context.Context, q string, n int) ([]qdriver.Task, error) {
	v, err := d.admin(ctx, q, "dead", n).Slice()
	if err != nil {
		return nil, fmt.Errorf("redis: dead letters of %q: %w", q, err)
	}
	cs, err := tasks(v)
	return plain(cs), err
}

func (d *taskDriver) Requeue(ctx context.Context, q, id string, delay time.Duration) (bool, error) {
	v, err := d.admin(ctx, q, "requeue", id, ms(delay)).Int()
	if err != nil {
		return false, fmt.Errorf("redis: requeue of %q on %q: %w", id, q, err)
	}
	return v == 1, nil
}

// Watch subscribes to the queue's wake-up channel (one pub/sub connection
// per Client, shared by every queue and wait; a channel stays subscribed 2s
// after its last waiter, so waits in a loop cost no SUBSCRIBE).
func (d *taskDriver) Watch(ctx context.Context, q string) (<-chan struct{}, func(), error) {
	c := make(chan struct{}, 1)
	x, err := d.hub.Watch(ctx, d.keys(q)[0]+":ready", "", func(string, bool) { redishub.Signal(c) })
	if err != nil {
		return nil, nil, err
	}
	return c, x.Stop, nil
}

func (d *taskDriver) Close() error {
	err := d.hub.Close()
	if d.owns {
		if cerr := d.c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
