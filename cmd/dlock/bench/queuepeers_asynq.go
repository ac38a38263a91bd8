package bench

import (
	"context"
	"errors"
	"time"

	"github.com/hibiken/asynq"
	goredis "github.com/redis/go-redis/v9"
)

// asynq's knobs for a fast run: its server looks for tasks every
// asynqCheck when its queues are empty (default 1s: a second's latency),
// and moves due scheduled tasks to the queue every asynqDelayedCheck
// (default 5s).
const (
	asynqCheck        = 10 * time.Millisecond
	asynqDelayedCheck = 10 * time.Millisecond
)

// asynqContender is hibiken/asynq: one go-redis client shared by an
// asynq.Client and an asynq.Server with Concurrency workers, each task
// with TaskID (deduplication by id) and the default retention (a
// completed task is deleted).
func asynqContender(rawURL string) queueContender {
	return queueContender{
		name: "asynq", version: moduleVersion("github.com/hibiken/asynq"),
		config: "Client + Server{Concurrency: workers, TaskCheckInterval: " + asynqCheck.String() +
			", DelayedTaskCheckInterval: " + asynqDelayedCheck.String() + "}, TaskID(id), ProcessIn(delay)",
		open: func(ctx context.Context, name string, workers int) (queueSystem, error) {
			o, err := goredis.ParseURL(rawURL)
			if err != nil {
				return nil, err
			}
			rc := goredis.NewClient(o)
			if err := rc.Ping(ctx).Err(); err != nil {
				_ = rc.Close()
				return nil, err
			}
			return &asynqSystem{rc: rc, c: asynq.NewClientFromRedisClient(rc), name: name, workers: workers}, nil
		},
	}
}

type asynqSystem struct {
	rc      *goredis.Client
	c       *asynq.Client
	name    string
	workers int
}

func (s *asynqSystem) Enqueue(ctx context.Context, id string, delay time.Duration) error {
	opts := []asynq.Option{asynq.Queue(s.name), asynq.TaskID(id)}
	if delay > 0 {
		opts = append(opts, asynq.ProcessIn(delay))
	}
	_, err := s.c.EnqueueContext(ctx, asynq.NewTask("dlock-bench", []byte(id)), opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil // kept: deduplicated
	}
	return err
}

func (s *asynqSystem) Work(ctx context.Context, started func(string)) (func() error, error) {
	srv := asynq.NewServerFromRedisClient(s.rc, asynq.Config{
		Concurrency:              s.workers,
		Queues:                   map[string]int{s.name: 1},
		TaskCheckInterval:        asynqCheck,
		DelayedTaskCheckInterval: asynqDelayedCheck,
		LogLevel:                 asynq.FatalLevel,
		ShutdownTimeout:          5 * time.Second,
	})
	err := srv.Start(asynq.HandlerFunc(func(_ context.Context, t *asynq.Task) error {
		started(string(t.Payload()))
		return nil
	}))
	if err != nil {
		return nil, err
	}
	return func() error { srv.Shutdown(); return nil }, nil
}

func (s *asynqSystem) Close(ctx context.Context, purge bool) error {
	var err error
	if purge {
		err = asynq.NewInspectorFromRedisClient(s.rc).DeleteQueue(s.name, true)
		if errors.Is(err, asynq.ErrQueueNotFound) {
			err = nil
		}
	}
	return errors.Join(err, s.rc.Close())
}
