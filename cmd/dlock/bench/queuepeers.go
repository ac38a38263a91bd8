package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock/queue"
	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// The queue peers bench (dlock bench queue -peers): dlock's task queue
// beside the queue libraries its users would otherwise pick on the same
// server, in the same run: hibiken/asynq on Redis, riverqueue/river on
// PostgreSQL (queuepeers_asynq.go, queuepeers_river.go). Every contender
// does the same work with the same number of workers: enqueue tasks with
// distinct ids (each deduplicated by id), process them, and start tasks
// enqueued one at a time while the workers are idle (due at once, and
// delayed).

// QueuePeerTarget is one backend of the peers bench.
type QueuePeerTarget struct {
	Backend string // "redis" or "postgres"
	URL     string // the server's URL as the peers open it (not redacted)
	Open    func(ctx context.Context) (*queue.Client, error)
	// ServerCPU reads the server's CPU time so far; nil when the server is
	// not the bench's own (-url).
	ServerCPU func() (time.Duration, error)
}

// QueuePeersConfig sizes a peers run.
type QueuePeersConfig struct {
	Duration time.Duration // of the enqueue turn; default 1s
	Workers  int           // default 8
	N        int           // tasks timed from enqueue to started, per kind; default 100
	Delay    time.Duration // the delayed tasks' delay; default 20ms
	Progress io.Writer
}

func (c QueuePeersConfig) withDefaults() QueuePeersConfig {
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
	return c
}

// QueuePeerResult is one contender's figures on one backend.
type QueuePeerResult struct {
	Backend   string
	Contender string // "dlock", "asynq", "river"
	Version   string
	Config    string // how it was configured
	// Tasks is how many tasks the enqueue turn queued, and the process turn
	// processed.
	Tasks      int
	EnqueueOps float64 // tasks enqueued per second, Workers enqueuing
	ProcessOps float64 // tasks processed per second, Workers working
	// Now and Delayed: from the enqueue's send (plus the delay) to the
	// task's start in a worker, with Workers idle workers.
	Now, Delayed *Latency
	Early        int // delayed tasks started before their delay had passed
	// Unit is what PerTask counts: "cmds" (Redis: INFO commandstats) or
	// "xacts" (PostgreSQL: pg_stat_database xact_commit + xact_rollback),
	// every client's, on the whole server.
	Unit string
	// PerTask is server commands or transactions per task in the enqueue
	// turn, the process turn and the idle turn (Now's: enqueue, wake-up,
	// claim, ack and whatever the idle workers do meanwhile); -1 unknown.
	PerTask [3]float64
	// CPUPerTask is the server's CPU time per task in the process and the
	// idle turn; zero unknown.
	CPUPerTask [2]time.Duration
	Errors     []string
}

// queueSystem is one contender's queue of one name.
type queueSystem interface {
	// Enqueue adds the task id, due after delay (0: at once); an id
	// already queued is kept (deduplicated).
	Enqueue(ctx context.Context, id string, delay time.Duration) error
	// Work starts workers that call started with each task's id as it
	// starts, until stop; stop returns once they have.
	Work(ctx context.Context, started func(id string)) (stop func() error, err error)
	// Close closes the system's connections; with purge it first removes
	// whatever it left on the server.
	Close(ctx context.Context, purge bool) error
}

// queueContender opens a contender's queueSystem.
type queueContender struct {
	name, version, config string
	open                  func(ctx context.Context, queueName string, workers int) (queueSystem, error)
}

// RunQueuePeers runs dlock's queue and each backend's peers through the
// same turns, one contender at a time: enqueue for cfg.Duration, process
// what was queued, then N tasks due at once and N delayed, each timed from
// its enqueue to its start.
func RunQueuePeers(ctx context.Context, cfg QueuePeersConfig, targets []QueuePeerTarget) []QueuePeerResult {
	cfg = cfg.withDefaults()
	var out []QueuePeerResult
	for _, t := range targets {
		contenders := []queueContender{dlockContender(t)}
		switch t.Backend {
		case "redis":
			contenders = append(contenders, asynqContender(t.URL))
		case "postgres":
			contenders = append(contenders, riverContender(t.URL))
		}
		count, closeCount, err := serverCounter(ctx, t.Backend, t.URL)
		for _, c := range contenders {
			res := QueuePeerResult{Backend: t.Backend, Contender: c.name, Version: c.version, Config: c.config, PerTask: [3]float64{-1, -1, -1}}
			if err != nil {
				res.Errors = append(res.Errors, "counting server work: "+err.Error())
				count = nil
			}
			runQueuePeer(ctx, cfg, t, c, count, &res)
			out = append(out, res)
		}
		if closeCount != nil {
			closeCount()
		}
	}
	return out
}

// peerTimeout bounds a turn that waits for tasks to be processed or to
// start: river starts a delayed task at its scheduler's next run (every
// 5s).
const peerTimeout = 30 * time.Second

func runQueuePeer(ctx context.Context, cfg QueuePeersConfig, t QueuePeerTarget, c queueContender, count func(context.Context) (int64, error), res *QueuePeerResult) {
	say := func(format string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "%-8s %-6s "+format+"\n", append([]any{t.Backend, c.name}, a...)...)
		}
	}
	fail := func(what string, err error) {
		res.Errors = append(res.Errors, what+": "+err.Error())
		say("%s FAILED: %v", what, err)
	}
	res.Unit = "xacts"
	if t.Backend == "redis" {
		res.Unit = "cmds"
	}
	m := peerMeter{backend: t.Backend, count: count, cpu: t.ServerCPU}
	name := queuePeerName(c.name)

	// Enqueue: Workers goroutines for cfg.Duration, at most maxQueued tasks.
	sys, err := c.open(ctx, name, cfg.Workers)
	if err != nil {
		fail("open", err)
		return
	}
	m0 := m.read(ctx)
	var queued atomic.Int64
	ops, err := parallel(ctx, cfg.Workers, cfg.Duration, func(w, i int) (bool, error) {
		if i >= maxQueued/cfg.Workers {
			return false, nil
		}
		if err := sys.Enqueue(ctx, fmt.Sprintf("t%d-%d", w, i), 0); err != nil {
			return false, err
		}
		queued.Add(1)
		return true, nil
	})
	tasks := int(queued.Load())
	if cerr := sys.Close(ctx, err != nil); err == nil {
		err = cerr
	}
	if err != nil {
		fail("enqueue", err)
		return
	}
	m.settle()
	res.EnqueueOps = ops
	res.PerTask[0], _ = m.per(m0, m.read(ctx), tasks)

	// Process: the tasks just queued, by Workers workers.
	sys, err = c.open(ctx, name, cfg.Workers)
	if err != nil {
		fail("open", err)
		return
	}
	seen := newSeen()
	m0 = m.read(ctx)
	start := time.Now()
	stop, err := sys.Work(ctx, seen.add)
	if err == nil {
		got := seen.waitN(ctx, tasks, peerTimeout)
		elapsed := time.Since(start)
		err = stop()
		res.Tasks = got
		res.ProcessOps = float64(got) / elapsed.Seconds()
		if got < tasks && err == nil {
			err = fmt.Errorf("%d of %d tasks processed in %v", got, tasks, peerTimeout)
		}
	}
	if cerr := sys.Close(ctx, true); err == nil {
		err = cerr
	}
	if err != nil {
		fail("process", err)
		return
	}
	m.settle()
	res.PerTask[1], res.CPUPerTask[0] = m.per(m0, m.read(ctx), res.Tasks)
	say("enqueue %s/s, process %s/s (%d tasks)", FormatOps(res.EnqueueOps), FormatOps(res.ProcessOps), res.Tasks)

	// Due at once, one at a time, to idle workers; then delayed.
	for i, delay := range []time.Duration{0, cfg.Delay} {
		lat, early, ops, cpu, err := queuePeerLatency(ctx, cfg, c, fmt.Sprintf("%s-l%d", name, i), delay, m)
		what := "due at once"
		if delay > 0 {
			what = "delayed " + delay.String()
		}
		if err != nil {
			fail(what, err)
			continue
		}
		if delay == 0 {
			res.Now = &lat
			res.PerTask[2], res.CPUPerTask[1] = ops, cpu
		} else {
			res.Delayed, res.Early = &lat, early
		}
		say("%s: enqueue→started p50 %s p99 %s", what, FormatDuration(lat.P50), FormatDuration(lat.P99))
	}
}

// queuePeerLatency starts cfg.Workers idle workers and enqueues cfg.N
// tasks: due at once, one at a time, each after the previous one started
// and 5ms idle; delayed, one every 10ms without waiting (a contender that
// starts delayed tasks late would otherwise take N times as long). Each is
// timed from its enqueue's send, plus delay, to its start: early is how
// many started before that (counted as 0).
func queuePeerLatency(ctx context.Context, cfg QueuePeersConfig, c queueContender, name string, delay time.Duration, m peerMeter) (Latency, int, float64, time.Duration, error) {
	sys, err := c.open(ctx, name, cfg.Workers)
	if err != nil {
		return Latency{}, 0, 0, 0, err
	}
	var (
		mu     sync.Mutex
		sentAt = map[string]time.Time{}
		lats   []time.Duration
		early  int
	)
	seen := newSeen()
	started := func(id string) {
		at := time.Now()
		mu.Lock()
		if s, ok := sentAt[id]; ok {
			d := at.Sub(s.Add(delay))
			if d < 0 {
				early++
				d = 0
			}
			lats = append(lats, d)
			delete(sentAt, id)
		}
		mu.Unlock()
		seen.add(id)
	}
	stop, err := sys.Work(ctx, started)
	if err != nil {
		_ = sys.Close(ctx, true)
		return Latency{}, 0, 0, 0, err
	}
	time.Sleep(200 * time.Millisecond) // the workers are idle
	m0 := m.read(ctx)
	begin := time.Now()
	for i := 0; i < cfg.N && err == nil; i++ {
		id := fmt.Sprintf("l%d", i)
		mu.Lock()
		sentAt[id] = time.Now()
		mu.Unlock()
		if err = sys.Enqueue(ctx, id, delay); err != nil {
			break
		}
		if delay == 0 {
			if seen.waitN(ctx, i+1, peerTimeout) < i+1 {
				err = fmt.Errorf("task %d not started within %v", i, peerTimeout)
			}
			time.Sleep(5 * time.Millisecond)
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err == nil && seen.waitN(ctx, cfg.N, peerTimeout) < cfg.N {
		err = fmt.Errorf("%d of %d tasks started within %v", seen.count(), cfg.N, peerTimeout)
	}
	elapsed := time.Since(begin)
	if serr := stop(); err == nil {
		err = serr
	}
	if cerr := sys.Close(ctx, true); err == nil {
		err = cerr
	}
	if err != nil {
		return Latency{}, 0, 0, 0, err
	}
	m.settle()
	ops, cpu := m.per(m0, m.read(ctx), cfg.N)
	mu.Lock()
	defer mu.Unlock()
	return Summarize(lats, elapsed), early, ops, cpu, nil
}

// peerMeter reads the server's counters before and after a turn.
type peerMeter struct {
	backend string
	count   func(context.Context) (int64, error) // nil: unknown
	cpu     func() (time.Duration, error)        // nil: unknown
}

// meterReading is one reading of a peerMeter.
type meterReading struct {
	n   int64
	cpu time.Duration
	ok  bool
}

func (m peerMeter) read(ctx context.Context) meterReading {
	var r meterReading
	if m.count != nil {
		n, err := m.count(ctx)
		r.n, r.ok = n, err == nil
	}
	if m.cpu != nil {
		r.cpu, _ = m.cpu()
	}
	return r
}

// per is the commands or transactions, and the CPU time, per task
// between a and b (-1 and 0 when unknown).
func (m peerMeter) per(a, b meterReading, tasks int) (float64, time.Duration) {
	if tasks == 0 {
		return -1, 0
	}
	ops := -1.0
	if a.ok && b.ok {
		ops = float64(b.n-a.n-1) / float64(tasks) // the second reading counts the first
	}
	var cpu time.Duration
	if b.cpu > a.cpu {
		cpu = (b.cpu - a.cpu) / time.Duration(tasks)
	}
	return ops, cpu
}

// settle lets the server count what the closed connections did:
// PostgreSQL's backends report their statistics as they exit.
func (m peerMeter) settle() {
	if m.backend == "postgres" {
		time.Sleep(300 * time.Millisecond)
	}
}

// seen counts the distinct tasks that started.
type seen struct {
	mu   sync.Mutex
	ids  map[string]bool
	n    int
	more chan struct{} // 1-buffered: n grew
}

func newSeen() *seen { return &seen{ids: map[string]bool{}, more: make(chan struct{}, 1)} }

func (s *seen) add(id string) {
	s.mu.Lock()
	if !s.ids[id] {
		s.ids[id] = true
		s.n++
	}
	s.mu.Unlock()
	select {
	case s.more <- struct{}{}:
	default:
	}
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// waitN waits until n tasks started, or timeout since the last one did,
// or ctx ends; it returns how many did.
func (s *seen) waitN(ctx context.Context, n int, timeout time.Duration) int {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		if got := s.count(); got >= n {
			return got
		}
		select {
		case <-s.more:
			t.Reset(timeout)
		case <-t.C:
			return s.count()
		case <-ctx.Done():
			return s.count()
		}
	}
}

var queuePeerSeq atomic.Int64

// queuePeerName is a queue name unique to the run, valid for every
// contender (river: lower-case letters, digits, '_' and '-').
func queuePeerName(contender string) string {
	return fmt.Sprintf("dlock-bench-%s-%s-%d", runID(), contender, queuePeerSeq.Add(1))
}

// serverCounter returns a function reading the server's commands (Redis:
// the calls of INFO commandstats) or transactions (PostgreSQL:
// xact_commit + xact_rollback of the database) so far, and one closing
// its connection.
func serverCounter(ctx context.Context, backend, rawURL string) (func(context.Context) (int64, error), func(), error) {
	switch backend {
	case "redis":
		o, err := goredis.ParseURL(rawURL)
		if err != nil {
			return nil, nil, err
		}
		c := goredis.NewClient(o)
		return func(ctx context.Context) (int64, error) {
			s, err := c.Info(ctx, "commandstats").Result()
			if err != nil {
				return 0, err
			}
			return commandCalls(s), nil
		}, func() { _ = c.Close() }, nil
	case "postgres":
		c, err := pgx.Connect(ctx, rawURL)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context) (int64, error) {
			var n int64
			err := c.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
			return n, err
		}, func() { _ = c.Close(context.Background()) }, nil
	}
	return nil, nil, fmt.Errorf("%s: no server counters", backend)
}

// commandCalls sums the calls of INFO commandstats's lines
// ("cmdstat_get:calls=3,usec=…").
func commandCalls(info string) int64 {
	var n int64
	for line := range strings.Lines(info) {
		_, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		if c, err := strconv.ParseInt(v, 10, 64); err == nil {
			n += c
		}
	}
	return n
}

// dlockContender is dlock's queue: one Client (its default pool), Workers
// goroutines each looping ClaimWait(1) and Ack.
func dlockContender(t QueuePeerTarget) queueContender {
	return queueContender{
		name: "dlock", version: dlockVersion(),
		config: "one Client, workers loop ClaimWait(1, 1m) + Ack",
		open: func(ctx context.Context, name string, workers int) (queueSystem, error) {
			c, err := t.Open(ctx)
			if err != nil {
				return nil, err
			}
			q, err := c.Queue(name, nil)
			if err != nil {
				_ = c.Close()
				return nil, err
			}
			return &dlockSystem{c: c, q: q, workers: workers}, nil
		},
	}
}

type dlockSystem struct {
	c       *queue.Client
	q       *queue.Queue
	workers int
}

func (s *dlockSystem) Enqueue(ctx context.Context, id string, delay time.Duration) error {
	_, err := s.q.Enqueue(ctx, id, &queue.EnqueueOptions{Delay: delay})
	return err
}

func (s *dlockSystem) Work(ctx context.Context, started func(string)) (func() error, error) {
	wctx, cancel := context.WithCancel(ctx)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		werr error
	)
	for range s.workers {
		wg.Go(func() {
			for {
				cs, err := s.q.ClaimWait(wctx, 1, time.Minute)
				if wctx.Err() != nil {
					return
				}
				if err == nil {
					for _, cl := range cs {
						started(cl.ID)
						err = errors.Join(err, cl.Ack(wctx))
					}
				}
				if err != nil && wctx.Err() == nil {
					mu.Lock()
					werr = errors.Join(werr, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	return func() error {
		cancel()
		wg.Wait()
		return werr
	}, nil
}

func (s *dlockSystem) Close(ctx context.Context, purge bool) error {
	if purge {
		for {
			ts, err := s.q.Pop(ctx, queue.MaxBatch)
			if err != nil || len(ts) == 0 {
				break
			}
		}
	}
	return s.c.Close()
}

// WriteQueuePeersText writes the peers table: per backend, each
// contender's row, then dlock ÷ each peer.
func WriteQueuePeersText(w io.Writer, cfg QueuePeersConfig, results []QueuePeerResult) error {
	cfg = cfg.withDefaults()
	fmt.Fprintf(w, "dlock's queue beside other libraries: %d workers, enqueue turn %v, %d tasks due at once and %d delayed %v, timed enqueue→started\n",
		cfg.Workers, cfg.Duration, cfg.N, cfg.N, cfg.Delay)
	if la := loadAverage(); la != nil {
		fmt.Fprintf(w, "machine load average %.2f %.2f %.2f\n", la[0], la[1], la[2])
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "backend\tqueue\tenqueue/s\tprocess/s\tnow p50\tp99\tdelayed p50\tp99\tearly\tper task: enqueue\tprocess\tidle\tcpu/task process\tidle")
	dur := func(l *Latency, p99 bool) string {
		if l == nil {
			return "-"
		}
		if p99 {
			return FormatDuration(l.P99)
		}
		return FormatDuration(l.P50)
	}
	perTask := func(v float64, unit string) string {
		if v < 0 {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', 1, 64) + " " + unit
	}
	cpu := func(d time.Duration) string {
		if d <= 0 {
			return "-"
		}
		return FormatDuration(d)
	}
	for i, r := range results {
		early := "-"
		if r.Delayed != nil {
			early = strconv.Itoa(r.Early)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Backend, r.Contender,
			FormatOps(r.EnqueueOps), FormatOps(r.ProcessOps), dur(r.Now, false), dur(r.Now, true), dur(r.Delayed, false), dur(r.Delayed, true), early,
			perTask(r.PerTask[0], r.Unit), perTask(r.PerTask[1], r.Unit), perTask(r.PerTask[2], r.Unit), cpu(r.CPUPerTask[0]), cpu(r.CPUPerTask[1]))
		if r.Contender == "dlock" {
			continue
		}
		// dlock ÷ this peer, from dlock's row of the same backend.
		var d *QueuePeerResult
		for j := range results[:i] {
			if results[j].Backend == r.Backend && results[j].Contender == "dlock" {
				d = &results[j]
			}
		}
		if d == nil {
			continue
		}
		lr := func(a, b *Latency, p99 bool) string {
			if a == nil || b == nil {
				return "-"
			}
			if p99 {
				return formatRatio(ratio(float64(a.P99), float64(b.P99)))
			}
			return formatRatio(ratio(float64(a.P50), float64(b.P50)))
		}
		fmt.Fprintf(tw, "%s\tdlock÷%s\t%s\t%s\t%s\t%s\t%s\t%s\t\t%s\t%s\t%s\t%s\t%s\n", r.Backend, r.Contender,
			formatRatio(ratio(d.EnqueueOps, r.EnqueueOps)), formatRatio(ratio(d.ProcessOps, r.ProcessOps)),
			lr(d.Now, r.Now, false), lr(d.Now, r.Now, true), lr(d.Delayed, r.Delayed, false), lr(d.Delayed, r.Delayed, true),
			formatRatio(ratio(d.PerTask[0], r.PerTask[0])), formatRatio(ratio(d.PerTask[1], r.PerTask[1])), formatRatio(ratio(d.PerTask[2], r.PerTask[2])),
			formatRatio(ratio(float64(d.CPUPerTask[0]), float64(r.CPUPerTask[0]))), formatRatio(ratio(float64(d.CPUPerTask[1]), float64(r.CPUPerTask[1]))))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nprocess/s: the enqueue turn's tasks over the time from starting the workers to the last task's start\n"+
		"(river marks jobs completed in batches after they ran). now/delayed: from the enqueue's send (+ the delay) to the\n"+
		"task's start in a worker, the workers idle; a delayed task started before its delay had passed counts 0 and is\n"+
		"counted in early. per task: the server's commands (redis: INFO commandstats) or transactions (postgres:\n"+
		"pg_stat_database) per task, every client's; idle: the due-at-once turn, with whatever the idle workers do\n"+
		"meanwhile. cpu/task: the server container's CPU time (servers the bench started only). dlock÷peer: above 1\n"+
		"dlock is faster (enqueue/s, process/s); below 1 it is quicker or does less (the rest).")
	for _, r := range results {
		fmt.Fprintf(w, "config: %s %s %s: %s\n", r.Backend, r.Contender, r.Version, r.Config)
	}
	for _, r := range results {
		for _, e := range r.Errors {
			fmt.Fprintf(w, "ERROR %s %s %s\n", r.Backend, r.Contender, e)
		}
	}
	return nil
}
