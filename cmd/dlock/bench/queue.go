package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock/queue"
	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// The task-queue bench (dlock bench queue): per backend, queue's driver
// beside a raw-client floor doing the same work with the fewest server
// commands, in turns.

// QueueTarget is one queue backend under test.
type QueueTarget struct {
	Backend string
	URL     string // redacted
	Open    func(ctx context.Context) (*queue.Client, error)
	// Floor opens a raw client; nil when the backend has none (memory).
	Floor func(ctx context.Context) (QueueFloor, error)
}

// QueueFloor is the fewest server commands that enqueue a task and take one
// due task.
type QueueFloor interface {
	Enqueue(ctx context.Context, q, id string) error
	// Take removes one due task and reports whether there was one (at
	// most once: Pop's work).
	Take(ctx context.Context, q string) (bool, error)
	// Claim moves one due task to the claimed tasks with a deadline and
	// returns its id ("" for none); Ack removes it (Claim and Ack's work).
	Claim(ctx context.Context, q string) (string, error)
	Ack(ctx context.Context, q, id string) error
	Close() error
}

// QueueConfig sizes a queue run.
type QueueConfig struct {
	Duration time.Duration // of each throughput turn; default 1s
	Workers  int           // default 8
	N        int           // delayed tasks timed for due-to-claimed; default 100
	Delay    time.Duration // their delay; default 20ms
	Rounds   int           // turns of driver and floor; default 2
	Progress io.Writer
}

// QueueResult is one backend's figures.
type QueueResult struct {
	Backend, URL                  string
	EnqueueOps, FloorEnqueueOps   float64
	ClaimAckOps, FloorClaimAckOps float64
	PopOps, FloorTakeOps          float64
	DueToClaimed                  *Latency
	Errors                        []string
}

func (c QueueConfig) withDefaults() QueueConfig {
	if c.Duration <= 0 {
		c.Duration = time.Second
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.N <= 0 {
		c.N = 100
	}
	if c.Delay <= 0 {
		c.Delay = 20 * time.Millisecond
	}
	if c.Rounds <= 0 {
		c.Rounds = 2
	}
	return c
}

// RunQueue measures every target: enqueue/s and claim+ack/s with
// cfg.Workers workers (each with its own client), against the floor's
// enqueue/s and take/s; and the due-to-claimed latency of delayed tasks
// with a worker blocked in ClaimWait (from when each was due to when the
// worker had it).
func RunQueue(ctx context.Context, cfg QueueConfig, targets []QueueTarget) []QueueResult {
	cfg = cfg.withDefaults()
	say := func(format string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", a...)
		}
	}
	var out []QueueResult
	for _, t := range targets {
		res := QueueResult{Backend: t.Backend, URL: t.URL}
		fail := func(what string, err error) {
			res.Errors = append(res.Errors, what+": "+err.Error())
			say("%-8s %s FAILED: %v", t.Backend, what, err)
		}
		for round := range cfg.Rounds {
			name := fmt.Sprintf("dlock-bench-q:%s:%d", runID(), round)
			ops, err := queueEnqueue(ctx, cfg, t, name)
			if err != nil {
				fail("enqueue", err)
				break
			}
			res.EnqueueOps += ops / float64(cfg.Rounds)
			ops, err = queueClaimAck(ctx, cfg, t, name)
			if err != nil {
				fail("claim+ack", err)
				break
			}
			res.ClaimAckOps += ops / float64(cfg.Rounds)
			if _, err := queueEnqueue(ctx, cfg, t, name+":pop"); err != nil {
				fail("enqueue", err)
				break
			}
			if ops, err = queuePop(ctx, cfg, t, name+":pop"); err != nil {
				fail("pop", err)
				break
			}
			res.PopOps += ops / float64(cfg.Rounds)
			if t.Floor != nil {
				fl, err := floorQueue(ctx, cfg, t, name+":floor")
				if err != nil {
					fail("floor", err)
					break
				}
				res.FloorEnqueueOps += fl[0] / float64(cfg.Rounds)
				res.FloorClaimAckOps += fl[1] / float64(cfg.Rounds)
				res.FloorTakeOps += fl[2] / float64(cfg.Rounds)
			}
		}
		say("%-8s enqueue %s/s (floor %s/s), claim+ack %s/s (floor %s/s), pop %s/s (floor %s/s)", t.Backend,
			formatOps(res.EnqueueOps), formatOps(res.FloorEnqueueOps), formatOps(res.ClaimAckOps), formatOps(res.FloorClaimAckOps),
			formatOps(res.PopOps), formatOps(res.FloorTakeOps))
		lat, err := queueDueToClaimed(ctx, cfg, t, fmt.Sprintf("dlock-bench-q:%s:due", runID()))
		if err != nil {
			fail("due-to-claimed", err)
		} else {
			res.DueToClaimed = &lat
			say("%-8s due-to-claimed p50 %s p99 %s", t.Backend, FormatDuration(lat.P50), FormatDuration(lat.P99))
		}
		out = append(out, res)
	}
	return out
}

// queues opens n queue clients and returns each one's queue of that name,
// and a function that closes them.
func queues(ctx context.Context, t QueueTarget, n int, name string) ([]*queue.Queue, func(), error) {
	var cs []*queue.Client
	closeAll := func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}
	qs := make([]*queue.Queue, 0, n)
	for range n {
		c, err := t.Open(ctx)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		cs = append(cs, c)
		q, err := c.Queue(name, nil)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		qs = append(qs, q)
	}
	return qs, closeAll, nil
}

// parallel runs f on every worker until d has passed and returns ops/s.
func parallel(ctx context.Context, workers int, d time.Duration, f func(w int, i int) (bool, error)) (float64, error) {
	var (
		ops  atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		ferr error
	)
	end := time.Now().Add(d)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
				ok, err := f(w, i)
				if err != nil {
					mu.Lock()
					ferr = err
					mu.Unlock()
					return
				}
				if !ok {
					return
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(ops.Load()) / time.Since(start).Seconds(), ferr
}

func queueEnqueue(ctx context.Context, cfg QueueConfig, t QueueTarget, name string) (float64, error) {
	qs, closeAll, err := queues(ctx, t, cfg.Workers, name)
	if err != nil {
		return 0, err
	}
	defer closeAll()
	return parallel(ctx, cfg.Workers, cfg.Duration, func(w, i int) (bool, error) {
		if i >= maxQueued/cfg.Workers {
			return false, nil
		}
		_, err := qs[w].Enqueue(ctx, fmt.Sprintf("t%d-%d", w, i), nil)
		return true, err
	})
}

// maxQueued bounds the tasks one enqueue turn queues (a fast backend could
// otherwise queue millions, and the memory driver scans its tasks).
const maxQueued = 20000

// queueClaimAck drains what queueEnqueue queued, one task per Claim and
// Ack, for cfg.Duration at most.
func queueClaimAck(ctx context.Context, cfg QueueConfig, t QueueTarget, name string) (float64, error) {
	qs, closeAll, err := queues(ctx, t, cfg.Workers, name)
	if err != nil {
		return 0, err
	}
	defer closeAll()
	ops, err := parallel(ctx, cfg.Workers, cfg.Duration, func(w, i int) (bool, error) {
		cl, err := qs[w].Claim(ctx, 1, time.Minute)
		if err != nil || len(cl) == 0 {
			return false, err
		}
		return true, cl[0].Ack(ctx)
	})
	// Whatever is left goes, so that a run leaves nothing behind.
	for {
		ts, perr := qs[0].Pop(ctx, queue.MaxBatch)
		if perr != nil || len(ts) == 0 {
			break
		}
	}
	return ops, err
}

// floorQueue measures the floor's enqueue/s, claim+ack/s and take/s.
func floorQueue(ctx context.Context, cfg QueueConfig, t QueueTarget, name string) ([3]float64, error) {
	var out [3]float64
	fs := make([]QueueFloor, cfg.Workers)
	for i := range fs {
		f, err := t.Floor(ctx)
		if err != nil {
			return out, err
		}
		defer f.Close()
		fs[i] = f
	}
	fill := func(q string) (float64, error) {
		return parallel(ctx, cfg.Workers, cfg.Duration, func(w, i int) (bool, error) {
			if i >= maxQueued/cfg.Workers {
				return false, nil
			}
			return true, fs[w].Enqueue(ctx, q, fmt.Sprintf("t%d-%d", w, i))
		})
	}
	var err error
	if out[0], err = fill(name); err != nil {
		return out, err
	}
	if out[1], err = parallel(ctx, cfg.Workers, cfg.Duration, func(w, i int) (bool, error) {
		id, err := fs[w].Claim(ctx, name)
		if err != nil || id == "" {
			return false, err
		}
		return true, fs[w].Ack(ctx, name, id)
	}); err != nil {
		return out, err
	}
	if _, err = fill(name + ":take"); err != nil {
		return out, err
	}
	out[2], err = parallel(ctx, cfg.Workers, cfg.Duration, func(w, i int) (bool, error) {
		return fs[w].Take(ctx, name+":take")
	})
	for _, q := range []string{name, name + ":take"} { // leave nothing behind
		for {
			if ok, err := fs[0].Take(ctx, q); err != nil || !ok {
				break
			}
		}
	}
	return out, err
}

// queuePop drains the queue with Pop(1) on every worker.
func queuePop(ctx context.Context, cfg QueueConfig, t QueueTarget, name string) (float64, error) {
	qs, closeAll, err := queues(ctx, t, cfg.Workers, name)
	if err != nil {
		return 0, err
	}
	defer closeAll()
	ops, err := parallel(ctx, cfg.Workers, cfg.Duration, func(w, i int) (bool, error) {
		ts, err := qs[w].Pop(ctx, 1)
		return len(ts) == 1, err
	})
	for {
		ts, perr := qs[0].Pop(ctx, queue.MaxBatch)
		if perr != nil || len(ts) == 0 {
			break
		}
	}
	return ops, err
}

// queueDueToClaimed enqueues cfg.N tasks with cfg.Delay, one at a time,
// while a worker waits in ClaimWait, and times from when each was due
// (the enqueue's send time plus the delay: the server's due time is no
// earlier) to when the worker had it.
func queueDueToClaimed(ctx context.Context, cfg QueueConfig, t QueueTarget, name string) (Latency, error) {
	qs, closeAll, err := queues(ctx, t, 2, name)
	if err != nil {
		return Latency{}, err
	}
	defer closeAll()
	producer, worker := qs[0], qs[1]
	var samples []time.Duration
	start := time.Now()
	for i := range cfg.N {
		got := make(chan error, 1)
		var at time.Time
		go func() {
			cl, err := worker.ClaimWait(ctx, 1, time.Minute)
			at = time.Now()
			if err == nil && len(cl) == 1 {
				err = cl[0].Ack(ctx)
			}
			got <- err
		}()
		time.Sleep(2 * time.Millisecond) // let the worker block first
		sent := time.Now()
		if _, err := producer.Enqueue(ctx, fmt.Sprintf("d%d", i), &queue.EnqueueOptions{Delay: cfg.Delay}); err != nil {
			return Latency{}, err
		}
		if err := <-got; err != nil {
			return Latency{}, err
		}
		samples = append(samples, max(at.Sub(sent.Add(cfg.Delay)), 0))
	}
	return Summarize(samples, time.Since(start)), nil
}

// WriteQueueText writes the queue bench's table.
func WriteQueueText(w io.Writer, cfg QueueConfig, results []QueueResult) error {
	cfg = cfg.withDefaults()
	fmt.Fprintf(w, "dlock bench queue: %d workers, %v per throughput turn, %d rounds; due-to-claimed of %d tasks delayed %v\n\n",
		cfg.Workers, cfg.Duration, cfg.Rounds, cfg.N, cfg.Delay)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "backend\tenqueue/s\t×floor\tclaim+ack/s\t×floor\tpop/s\t×floor\tdue→claimed p50\tp99")
	for _, r := range results {
		due50, due99 := "-", "-"
		if r.DueToClaimed != nil {
			due50, due99 = FormatDuration(r.DueToClaimed.P50), FormatDuration(r.DueToClaimed.P99)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Backend,
			formatOps(r.EnqueueOps), formatRatio(ratio(r.EnqueueOps, r.FloorEnqueueOps)),
			formatOps(r.ClaimAckOps), formatRatio(ratio(r.ClaimAckOps, r.FloorClaimAckOps)),
			formatOps(r.PopOps), formatRatio(ratio(r.PopOps, r.FloorTakeOps)), due50, due99)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\n×floor: over a raw client doing the same work with the fewest server commands, in the same run. redis:\n"+
		"one script each (enqueue ZADD NX+HSET; claim ZRANGEBYSCORE+ZREM+ZADD; ack ZREM+HDEL; pop ZRANGEBYSCORE+ZREM+HDEL).\n"+
		"postgres: one statement each (INSERT; UPDATE/DELETE … FOR UPDATE SKIP LOCKED; DELETE). One task per Claim, Ack\n"+
		"and Pop; enqueue turns stop at 20000 tasks. memory and mysql have no floor.")
	for _, r := range results {
		for _, e := range r.Errors {
			fmt.Fprintf(w, "ERROR %s %s\n", r.Backend, e)
		}
	}
	return nil
}

// RedisQueueFloor opens raw go-redis clients on the URL's server.
func RedisQueueFloor(u *url.URL) func(ctx context.Context) (QueueFloor, error) {
	return func(ctx context.Context) (QueueFloor, error) {
		o, err := goredis.ParseURL(u.String())
		if err != nil {
			return nil, err
		}
		return &redisQFloor{c: goredis.NewClient(o)}, nil
	}
}

var (
	floorEnqueue = goredis.NewScript(`if redis.call("ZADD", KEYS[1], "NX", ARGV[2], ARGV[1]) == 1 then redis.call("HSET", KEYS[2], ARGV[1], "") end return 1`)
	floorTake    = goredis.NewScript(`local t = redis.call("TIME") local now = tonumber(t[1]) * 1000
local id = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now, "LIMIT", 0, 1)[1]
if not id then return 0 end
redis.call("ZREM", KEYS[1], id) redis.call("HDEL", KEYS[2], id) return 1`)
)

var (
	floorClaim = goredis.NewScript(`local t = redis.call("TIME") local now = tonumber(t[1]) * 1000
local id = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now, "LIMIT", 0, 1)[1]
if not id then return "" end
redis.call("ZREM", KEYS[1], id) redis.call("ZADD", KEYS[3], now + 60000, id) return id`)
	floorAck = goredis.NewScript(`if redis.call("ZREM", KEYS[3], ARGV[1]) == 1 then redis.call("HDEL", KEYS[2], ARGV[1]) end return 1`)
)

type redisQFloor struct{ c *goredis.Client }

func (f *redisQFloor) Claim(ctx context.Context, q string) (string, error) {
	return floorClaim.Run(ctx, f.c, f.keys(q)).Text()
}

func (f *redisQFloor) Ack(ctx context.Context, q, id string) error {
	return floorAck.Run(ctx, f.c, f.keys(q), id).Err()
}

func (f *redisQFloor) keys(q string) []string {
	return []string{"dlock-bench-floor:{" + q + "}:due", "dlock-bench-floor:{" + q + "}:payload", "dlock-bench-floor:{" + q + "}:claimed"}
}

func (f *redisQFloor) Enqueue(ctx context.Context, q, id string) error {
	return floorEnqueue.Run(ctx, f.c, f.keys(q), id, time.Now().UnixMilli()).Err()
}

func (f *redisQFloor) Take(ctx context.Context, q string) (bool, error) {
	n, err := floorTake.Run(ctx, f.c, f.keys(q)).Int()
	return n == 1, err
}

func (f *redisQFloor) Close() error { return f.c.Close() }

// PostgresQueueFloor opens raw pgx connections; the table is the driver's
// (it exists once the driver has run).
func PostgresQueueFloor(u *url.URL) func(ctx context.Context) (QueueFloor, error) {
	return func(ctx context.Context) (QueueFloor, error) {
		c, err := pgx.Connect(ctx, u.String())
		if err != nil {
			return nil, err
		}
		return &pgQFloor{c: c}, nil
	}
}

type pgQFloor struct{ c *pgx.Conn }

func (f *pgQFloor) Enqueue(ctx context.Context, q, id string) error {
	_, err := f.c.Exec(ctx, `INSERT INTO dlock_tasks (queue, id, due, payload) VALUES ($1, $2, now(), '') ON CONFLICT DO NOTHING`, q, id)
	return err
}

func (f *pgQFloor) Take(ctx context.Context, q string) (bool, error) {
	tag, err := f.c.Exec(ctx, `DELETE FROM dlock_tasks t USING (SELECT id FROM dlock_tasks WHERE queue = $1 AND state = 0
		AND due <= now() ORDER BY due, id LIMIT 1 FOR UPDATE SKIP LOCKED) c WHERE t.queue = $1 AND t.id = c.id`, q)
	return tag.RowsAffected() == 1, err
}

func (f *pgQFloor) Claim(ctx context.Context, q string) (string, error) {
	var id string
	err := f.c.QueryRow(ctx, `UPDATE dlock_tasks t SET state = 1, due = now() + interval '1 minute' FROM (SELECT id FROM dlock_tasks
		WHERE queue = $1 AND state = 0 AND due <= now() ORDER BY due, id LIMIT 1 FOR UPDATE SKIP LOCKED) c
		WHERE t.queue = $1 AND t.id = c.id RETURNING t.id`, q).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
}

func (f *pgQFloor) Ack(ctx context.Context, q, id string) error {
	_, err := f.c.Exec(ctx, `DELETE FROM dlock_tasks WHERE queue = $1 AND id = $2 AND state = 1`, q, id)
	return err
}

func (f *pgQFloor) Close() error { return f.c.Close(context.Background()) }
