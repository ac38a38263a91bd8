package redisqueue

import (
	"context"
	_ "embed"
	"fmt"
	"net/url"
	"strconv"
	"sync"
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
	d := &taskDriver{c: client, prefix: DefaultQueuePrefix, owns: owns, id: qdriver.NewToken(), groups: map[string]*waitGroup{}}
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
	id     string // this Client's, in its waiter entries

	wmu    sync.Mutex
	groups map[string]*waitGroup // by queue: this Client's waiters
	seq    uint64                // numbers the waiter entries
	closed bool
	bg     sync.WaitGroup // the lingering groups' timers

	migrated sync.Map // queue name -> struct{}: see migrate
}

// waitGroup is a Client's waiters of one queue (see Watch): one
// subscription, one waiter entry on the server, and a channel per waiter.
type waitGroup struct {
	member string                     // the waiter entry in P{Q}:waiters
	chans  map[chan struct{}]struct{} // the waiters'
	refs   int                        // Watch calls holding the group
	ready  chan struct{}              // closed once x is set up, or err
	x      *redishub.Watcher
	err    error
	linger *time.Timer // set while no one holds the group: ends it
}

// waitLinger is how long a Client's waiter entry and subscription of a
// queue outlive its last waiter: a worker that waits in a loop pays for
// neither again, and Enqueues stop publishing this long after the last
// waiter of every Client has left.
const waitLinger = 2 * time.Second

func (d *taskDriver) keys(q string) []string {
	k := d.prefix + "{" + q + "}:"
	return []string{k + "due", k + "claimed", k + "dead", k + "payload", k + "info", k + "waiters"}
}

// migrate converts, once per queue and Client, what the previous layout
// stored for the queue (tasks_admin.lua's "migrate": attempts move from
// P{Q}:info into P{Q}:payload) before the Client's first operation on it.
// Claims an older client made are left for it to settle, and otherwise
// recovered when they expire.
func (d *taskDriver) migrate(ctx context.Context, q string) error {
	if _, ok := d.migrated.Load(q); ok {
		return nil
	}
	for cursor := "0"; ; {
		next, err := tasksAdmin.Run(ctx, d.c, d.keys(q), "migrate", cursor).Text()
		if err != nil {
			return fmt.Errorf("converting the previous layout: %w", err)
		}
		if next == "0" {
			break
		}
		cursor = next
	}
	d.migrated.Store(q, struct{}{})
	return nil
}

// run runs a script on the queue's keys, the queue's previous layout
// converted first.
func (d *taskDriver) run(ctx context.Context, s *goredis.Script, q string, args ...any) *goredis.Cmd {
	if err := d.migrate(ctx, q); err != nil {
		cmd := goredis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return s.Run(ctx, d.c, d.keys(q), args...)
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
	v, err := d.run(ctx, tasksEnqueue, q, r.ID, ms(r.Delay), at, r.Payload, int(r.Mode)).Int()
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
	// A Claim or Pop of a Client with waiters on the queue renews their
	// entry when it finds nothing (tasks_take.lua): it may be a waiter's,
	// about to wait.
	var (
		g      *waitGroup
		member string
		token  string
	)
	if op != "peek" {
		d.wmu.Lock()
		if g = d.groups[q]; g != nil {
			member = g.member
		}
		d.wmu.Unlock()
	}
	if op == "claim" {
		token = qdriver.NewToken() // the script makes each claim's token of it, its attempts and its index
	}
	v, err := d.run(ctx, tasksTake, q, op, n, ms(vis), max, token, member).Slice()
	if err != nil {
		if g != nil {
			// This may have been the waiter woken for a task it did
			// not take: another looks.
			d.wmu.Lock()
			wakeOne(g)
			d.wmu.Unlock()
		}
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
	v, err := d.run(ctx, tasksSettle, q, op, id, token, ms(dur), max).Int()
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
	return d.run(ctx, tasksAdmin, q, args...)
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

// Watch registers a waiter of the queue. A Client's waiters of one queue
// form a group (waitGroup): one subscription to the queue's wake-up
// channel (on the Client's one pub/sub connection, shared by every queue),
// and one waiter entry on the server, which the group's Claims and Pops
// that find nothing renew, and without which no change publishes. Each
// message wakes one waiter of the group, one without a wake-up pending
// (when all have one, all are awake and will look); a waiter that leaves
// with its wake-up unread passes it on, and so does one whose Claim or Pop
// failed. A connection that failed, or was subscribed again, wakes them
// all. The group outlives its last waiter by waitLinger, so that waits in
// a loop cost no round trip.
func (d *taskDriver) Watch(ctx context.Context, q string) (<-chan struct{}, func(), error) {
	for {
		d.wmu.Lock()
		if d.closed {
			d.wmu.Unlock()
			return nil, nil, dlock.ErrClosed
		}
		g := d.groups[q]
		lead := g == nil
		if lead {
			d.seq++
			g = &waitGroup{member: d.id + ":" + strconv.FormatUint(d.seq, 10), chans: map[chan struct{}]struct{}{}, ready: make(chan struct{})}
			d.groups[q] = g
		}
		g.refs++
		if g.linger != nil {
			if g.linger.Stop() {
				d.bg.Done()
			}
			g.linger = nil
		}
		d.wmu.Unlock()
		if lead {
			x, err := d.hub.Watch(ctx, d.keys(q)[0]+":ready", "", func(_ string, message bool) { d.notify(g, message) })
			d.wmu.Lock()
			g.x, g.err = x, err
			close(g.ready)
			if err != nil && d.groups[q] == g {
				delete(d.groups, q)
			}
			d.wmu.Unlock()
		} else {
			select {
			case <-g.ready:
			case <-ctx.Done():
				d.unwatch(q, g, nil)
				return nil, nil, ctx.Err()
			}
		}
		if g.err != nil {
			if lead || ctx.Err() != nil {
				return nil, nil, g.err
			}
			continue // the leader's own failure (its ctx ended, say): again
		}
		c := make(chan struct{}, 1)
		d.wmu.Lock()
		g.chans[c] = struct{}{}
		d.wmu.Unlock()
		return c, func() { d.unwatch(q, g, c) }, nil
	}
}

// notify is the group's subscription's: a message wakes one waiter, a
// connection that failed or was subscribed again all of them.
func (d *taskDriver) notify(g *waitGroup, message bool) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if message {
		wakeOne(g)
		return
	}
	for c := range g.chans {
		redishub.Signal(c)
	}
}

// wakeOne signals one waiter of g that has no signal pending; d.wmu is
// held.
func wakeOne(g *waitGroup) {
	for c := range g.chans {
		if len(c) == 0 {
			redishub.Signal(c)
			return
		}
	}
}

// unwatch ends a waiter's hold on g (c nil: one that never joined): an
// unread wake-up is passed on, and the last one out starts the linger.
func (d *taskDriver) unwatch(q string, g *waitGroup, c chan struct{}) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if c != nil {
		delete(g.chans, c)
		select {
		case <-c: // a wake-up this waiter did not act on: another's
			wakeOne(g)
		default:
		}
	}
	g.refs--
	if g.refs > 0 || d.groups[q] != g || d.closed {
		return
	}
	d.bg.Add(1)
	g.linger = time.AfterFunc(waitLinger, func() {
		defer d.bg.Done()
		d.expire(q, g)
	})
}

// expire ends a group no one has held for waitLinger: its subscription
// and its waiter entry.
func (d *taskDriver) expire(q string, g *waitGroup) {
	d.wmu.Lock()
	if d.groups[q] != g || g.refs > 0 || d.closed {
		d.wmu.Unlock()
		return
	}
	delete(d.groups, q)
	g.linger = nil
	d.wmu.Unlock()
	g.x.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), unwaitTimeout)
	defer cancel()
	_ = d.admin(ctx, q, "unwait", g.member).Err() // else it lapses
}

// unwaitTimeout bounds the removal of a waiter entry, which lapses by
// itself otherwise (tasks_common.lua's waiterLife).
const unwaitTimeout = time.Second

func (d *taskDriver) Close() error {
	d.wmu.Lock()
	d.closed = true
	members := map[string]string{} // by queue
	for q, g := range d.groups {
		if g.linger != nil && g.linger.Stop() {
			d.bg.Done()
		}
		members[q] = g.member
	}
	d.groups = map[string]*waitGroup{}
	d.wmu.Unlock()
	d.bg.Wait()
	// The waiter entries go at once, not when they lapse: changes stop
	// publishing for this Client.
	ctx, cancel := context.WithTimeout(context.Background(), unwaitTimeout)
	for q, m := range members {
		if ctx.Err() == nil {
			_ = d.admin(ctx, q, "unwait", m).Err()
		}
	}
	cancel()
	err := d.hub.Close()
	if d.owns {
		if cerr := d.c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
