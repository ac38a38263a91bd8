package bench

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// riverSchema holds river's tables, migrated at its first use in a run.
const riverSchema = "dlock_bench_river"

// river's knobs for a fast run: a producer fetches again at most every
// riverCooldown (default 100ms: with 8 workers at most 80 tasks a second)
// and polls every riverPoll besides LISTEN/NOTIFY (default 1s).
const (
	riverCooldown = time.Millisecond
	riverPoll     = 50 * time.Millisecond
)

// riverMigrated remembers the URLs whose schema is migrated.
var riverMigrated sync.Map

// riverContender is riverqueue/river with riverpgxv5: one pgxpool (the
// URL's settings) shared by a river.Client with one queue of MaxWorkers
// workers, jobs unique by args and queue (deduplication by id).
func riverContender(rawURL string) queueContender {
	return queueContender{
		name: "river", version: moduleVersion("github.com/riverqueue/river"),
		config: "riverpgxv5, Client{Queues: {MaxWorkers: workers}, FetchCooldown: " + riverCooldown.String() +
			", FetchPollInterval: " + riverPoll.String() + "}, UniqueOpts{ByArgs, ByQueue}, ScheduledAt; schema " + riverSchema,
		open: func(ctx context.Context, name string, workers int) (queueSystem, error) {
			pool, err := pgxpool.New(ctx, rawURL)
			if err != nil {
				return nil, err
			}
			s, err := newRiverSystem(ctx, rawURL, pool, name, workers)
			if err != nil {
				pool.Close()
				return nil, err
			}
			return s, nil
		},
	}
}

// riverArgs is the bench's job: the task's id.
type riverArgs struct {
	ID string `json:"id"`
}

func (riverArgs) Kind() string { return "dlock_bench" }

type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	started *atomic.Pointer[func(string)]
}

func (w *riverWorker) Work(_ context.Context, job *river.Job[riverArgs]) error {
	if f := w.started.Load(); f != nil {
		(*f)(job.Args.ID)
	}
	return nil
}

type riverSystem struct {
	pool    *pgxpool.Pool
	c       *river.Client[pgx.Tx]
	name    string
	started atomic.Pointer[func(string)]
}

func newRiverSystem(ctx context.Context, rawURL string, pool *pgxpool.Pool, name string, workers int) (*riverSystem, error) {
	quiet := slog.New(slog.DiscardHandler)
	if _, done := riverMigrated.Load(rawURL); !done {
		if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+riverSchema); err != nil {
			return nil, err
		}
		m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: riverSchema, Logger: quiet})
		if err != nil {
			return nil, err
		}
		if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
			return nil, err
		}
		riverMigrated.Store(rawURL, true)
	}
	s := &riverSystem{pool: pool, name: name}
	ws := river.NewWorkers()
	river.AddWorker(ws, &riverWorker{started: &s.started})
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{name: {MaxWorkers: workers}},
		Workers:           ws,
		FetchCooldown:     riverCooldown,
		FetchPollInterval: riverPoll,
		Logger:            quiet,
		Schema:            riverSchema,
	})
	if err != nil {
		return nil, err
	}
	s.c = c
	return s, nil
}

func (s *riverSystem) Enqueue(ctx context.Context, id string, delay time.Duration) error {
	opts := &river.InsertOpts{Queue: s.name, UniqueOpts: river.UniqueOpts{ByArgs: true, ByQueue: true}}
	if delay > 0 {
		opts.ScheduledAt = time.Now().Add(delay)
	}
	_, err := s.c.Insert(ctx, riverArgs{ID: id}, opts)
	return err
}

func (s *riverSystem) Work(ctx context.Context, started func(string)) (func() error, error) {
	s.started.Store(&started)
	// The client runs until Stop: a cancelled Start ctx would stop it hard.
	if err := s.c.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	return func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return s.c.Stop(sctx)
	}, nil
}

func (s *riverSystem) Close(ctx context.Context, purge bool) error {
	var err error
	if purge {
		_, err = s.pool.Exec(ctx, "DELETE FROM "+riverSchema+".river_job WHERE queue = $1", s.name)
		if err == nil {
			_, err = s.pool.Exec(ctx, "DELETE FROM "+riverSchema+".river_queue WHERE name = $1", s.name)
		}
	}
	s.pool.Close()
	return err
}
