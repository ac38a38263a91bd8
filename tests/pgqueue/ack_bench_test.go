package pgqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/queue"
	"github.com/dlock/dlock/queue/pgqueue"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkAck acks claims on a queue that holds 5,000 live claims of
// other workers (the claimed tasks of a busy queue): an Ack is one
// primary-key lookup, whatever the claims around it. The floor deletes
// the same rows by their key alone, through the same pool.
func BenchmarkAck(b *testing.B) {
	b.Run("ack", func(b *testing.B) { benchAck(b, false) })
	b.Run("floor", func(b *testing.B) { benchAck(b, true) })
}

func benchAck(b *testing.B, floor bool) {
	const live, batch = 5000, 500
	srv := dlocktest.Require(b, dlocktest.Postgres)
	ctx := context.Background()
	pool := benchPool(b, srv.Addr())
	table := fmt.Sprintf("dlock_tasks_ack_%d", time.Now().UnixNano())
	b.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	name := "bench-ack"
	q := benchQueue(b, pool, table, name)
	if _, err := q.Peek(ctx, 1); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (queue, id, state, due, payload, attempts, token)
		SELECT $1, 'live'||g, 1, now() + interval '1 hour', '', 1, 'x:live'||g FROM generate_series(1, %d) g`, table, live), name); err != nil {
		b.Fatal(err)
	}
	seq := 0
	b.ResetTimer()
	for done := 0; done < b.N; {
		b.StopTimer()
		k := min(batch, b.N-done)
		if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (queue, id, due, payload)
			SELECT $1, 'a'||($2::int + g), now(), '' FROM generate_series(1, $3::int) g`, table), name, seq, k); err != nil {
			b.Fatal(err)
		}
		seq += k
		var cs []*queue.Claim
		for len(cs) < k {
			got, err := q.Claim(ctx, k-len(cs), time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			cs = append(cs, got...)
		}
		b.StartTimer()
		for _, c := range cs {
			var err error
			if floor {
				_, err = pool.Exec(ctx, "DELETE FROM "+table+" WHERE queue = $1 AND id = $2", name, c.ID)
			} else {
				err = c.Ack(ctx)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		done += k
	}
}

func benchPool(b *testing.B, addr string) *pgxpool.Pool {
	b.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), poolConfig(b, addr))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

func benchQueue(b *testing.B, pool *pgxpool.Pool, table, name string) *queue.Queue {
	b.Helper()
	c, err := pgqueue.NewQueue(pool, &pgqueue.QueueOptions{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	q, err := c.Queue(name, nil)
	if err != nil {
		b.Fatal(err)
	}
	return q
}
