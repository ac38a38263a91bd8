package postgres_test

import (
	"context"
	"os"
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
	addr   string
	raw    *pgx.Conn // straight to the server, for Residue; nil: one per call
	shared bool      // Options.SharedSessions
}

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p, err := faultnet.Listen(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	o := &postgres.Options{SharedSessions: h.shared}
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

// Residue lists the advisory lock entries, held or awaited, of name's keys
// in every kind's namespace (kindEntries), and the metadata rows of name: a
// waiter's entry outliving its wait is orphaned waiter state.
func (h harness) Residue(ctx context.Context, name string) ([]string, error) {
	if h.raw != nil {
		return residue(ctx, h.raw, name)
	}
	// A connection of its own each time: the server may have been restarted
	// since the last.
	c, err := pgx.Connect(ctx, dsn(h.addr))
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	return residue(ctx, c, name)
}

func residue(ctx context.Context, c *pgx.Conn, name string) ([]string, error) {
	left, err := kindEntries(ctx, c, name)
	if err != nil {
		return nil, err
	}
	rows, err := metadataRows(ctx, c, name)
	return append(left, rows...), err
}

// ownServer is a harness on a server of the test's own, which the suite's
// Chaos section may pause and restart.
type ownServer struct {
	harness
	srv *servers.Server
}

func (h ownServer) PauseServer(ctx context.Context) error   { return h.srv.Pause(ctx) }
func (h ownServer) ResumeServer(ctx context.Context) error  { return h.srv.Unpause(ctx) }
func (h ownServer) RestartServer(ctx context.Context) error { return h.srv.Restart(ctx) }

// runConformance runs the suite on a server of its own, so that the Chaos
// section can pause and restart it; on an external server
// (DLOCK_POSTGRES_ADDR) it runs without server faults.
func runConformance(t *testing.T, cfg conformance.Config) { runConformanceOf(t, cfg, false) }

func runConformanceOf(t *testing.T, cfg conformance.Config, shared bool) {
	if os.Getenv("DLOCK_POSTGRES_ADDR") != "" {
		srv := servers.Require(t, servers.Postgres)
		conformance.RunConfig(t, harness{addr: srv.Addr(), raw: rawConn(t, srv.Addr()), shared: shared}, cfg)
		return
	}
	srv := servers.RequireNew(t, servers.Postgres)
	conformance.RunConfig(t, ownServer{harness{addr: srv.Addr(), shared: shared}, srv}, cfg)
}

func TestConformance(t *testing.T) { runConformance(t, conformance.Config{}) }

// The suite with Options.SharedSessions: locks stacked on shared sessions,
// waits on dedicated connections.
func TestConformanceShared(t *testing.T) { runConformanceOf(t, conformance.Config{}, true) }

// The suite again at the declared MinTTL: the bounds hold for the shortest
// TTL the driver accepts.
func TestConformanceMinTTL(t *testing.T) {
	runConformance(t, conformance.Config{TTL: postgres.MinTTL, Chaos: 10 * time.Second})
}

// The shared-session suite at its declared MinTTL.
func TestConformanceSharedMinTTL(t *testing.T) {
	runConformanceOf(t, conformance.Config{TTL: postgres.SharedMinTTL, Chaos: 10 * time.Second}, true)
}
