package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5"
)

// harness gives every locker its own pool dialling the shared server through
// its own faultnet proxy.
type harness struct {
	addr string
	raw  *pgx.Conn // straight to the server, for Residue
}

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p, err := faultnet.Listen(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	o := &postgres.Options{}
	if defaults != nil {
		o.Defaults = *defaults
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := postgres.NewFromConfig(ctx, poolConfig(t, p.Addr()), o)
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

// Residue lists the advisory lock entries, held or awaited, of name's key.
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	return lockEntries(ctx, h.raw, name)
}

func TestConformance(t *testing.T) {
	srv := servers.Require(t, servers.Postgres)
	conformance.Run(t, harness{addr: srv.Addr(), raw: rawConn(t, srv.Addr())})
}

// The suite again at the declared MinTTL: the bounds hold for the shortest
// TTL the driver accepts.
func TestConformanceMinTTL(t *testing.T) {
	srv := servers.Require(t, servers.Postgres)
	conformance.RunConfig(t, harness{addr: srv.Addr(), raw: rawConn(t, srv.Addr())}, conformance.Config{TTL: postgres.MinTTL})
}
