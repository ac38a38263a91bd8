package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5"
)

// harness gives every locker its own pool dialling the shared server through
// its own faultnet proxy.
type harness struct {
	addr string
	raw  *pgx.Conn        // straight to the server, for Residue; nil: one per call
	opts postgres.Options // without Defaults
	// maxConns, when not 0, is the pool's MaxConns (else 32): by default a
	// Locker's locks share sessions past half of it
	maxConns int32
}

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	t.Helper()
	p := faultnet.ListenT(t, h.addr)
	o := h.opts
	if defaults != nil {
		o.Defaults = *defaults
	}
	cfg := poolConfig(t, p.Addr())
	if h.maxConns != 0 {
		cfg.MaxConns = h.maxConns
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := postgres.NewFromConfig(ctx, cfg, &o)
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
	srv *dlocktest.Server
}

func (h ownServer) PauseServer(ctx context.Context) error   { return h.srv.Pause(ctx) }
func (h ownServer) ResumeServer(ctx context.Context) error  { return h.srv.Unpause(ctx) }
func (h ownServer) RestartServer(ctx context.Context) error { return h.srv.Restart(ctx) }

// runConformance runs the suite on a server of its own, so that the Chaos
// section can pause and restart it; on an external server
// (DLOCK_POSTGRES_ADDR) it runs without server faults.
func runConformance(t *testing.T, cfg conformance.Config) { runConformanceOf(t, cfg, harness{}) }

// runConformanceOf is runConformance with h's options and pool size.
func runConformanceOf(t *testing.T, cfg conformance.Config, h harness) {
	if os.Getenv("DLOCK_POSTGRES_ADDR") != "" {
		srv := dlocktest.Require(t, dlocktest.Postgres)
		h.addr, h.raw = srv.Addr(), rawConn(t, srv.Addr())
		conformance.RunConfig(t, h, cfg)
		return
	}
	srv := dlocktest.RequireNew(t, dlocktest.Postgres)
	h.addr = srv.Addr()
	conformance.RunConfig(t, ownServer{h, srv}, cfg)
}

// The suite with the defaults: a lock takes a connection of its own while
// the Locker's locks hold fewer than half of the pool (16 of 32), and
// shares a session past them. The suite holds fewer than 16 locks per
// Locker, so this run is also the one of Options.NoSharedSessions (a
// connection per lease), whose own limits url_test.go covers.
func TestConformance(t *testing.T) { runConformance(t, conformance.Config{}) }

// The suite with the defaults on a pool of 6: past 3 locks on connections
// of their own, locks share sessions, so that the suite's properties hold
// for a Locker whose leases are on both.
func TestConformanceSpill(t *testing.T) {
	runConformanceOf(t, conformance.Config{}, harness{maxConns: 6})
}

// The suite with Options.SharedSessions: every lock stacked on shared
// sessions, waits on dedicated connections.
//
// At a 1s TTL: at the default 500ms (SharedMinTTL), beside two busy loops
// (load ~7), a FIFOOrder holder's refresh on its shared session did not
// land before its ValidUntil.
func TestConformanceShared(t *testing.T) {
	runConformanceOf(t, conformance.Config{TTL: time.Second}, harness{opts: postgres.Options{SharedSessions: true}})
}

// The suite's default TTL is the larger of 500ms and the driver's MinTTL,
// which is 500ms for both modes: the suites above, but Shared, run at
// MinTTL already.
