package postgres_test

import (
	"context"
	"testing"

	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/postgres"
	"github.com/dlock/dlock/queue"
	qconf "github.com/dlock/dlock/queue/conformance"
	"github.com/jackc/pgx/v5/pgxpool"
)

type queueHarness struct {
	addr string
	raw  *pgxpool.Pool
}

func (h queueHarness) NewClient(t *testing.T) (*queue.Client, conformance.Faults) {
	t.Helper()
	p, err := faultnet.Listen(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	cfg, err := pgxpool.ParseConfig(dsn(p.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c, err := postgres.NewQueue(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

func (h queueHarness) Residue(ctx context.Context, name string) ([]string, error) {
	rows, err := h.raw.Query(ctx, "SELECT id FROM dlock_tasks WHERE queue = $1", name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		left = append(left, "dlock_tasks row "+id)
	}
	return left, rows.Err()
}

// The task queue on PostgreSQL passes the suite.
func TestQueueConformance(t *testing.T) {
	srv := servers.Require(t, servers.Postgres)
	raw, err := pgxpool.New(t.Context(), dsn(srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)
	qconf.Run(t, queueHarness{addr: srv.Addr(), raw: raw})
}
