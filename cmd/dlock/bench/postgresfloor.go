package bench

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/dlock/dlock"
	"github.com/jackc/pgx/v5"
)

// PostgresFloors returns an opener of raw PostgreSQL floors for the server of
// a postgres:// or postgresql:// URL: each Floor is one pgx connection, made
// from the URL as the postgres driver makes its pool's (libpq parameters,
// run-time settings), with dlock's lock options, the driver's own parameters
// (prefix, fencing, fence_schema, session_pooler) and pgxpool's pool_* parameters left
// out.
//
// TryLock is `SELECT pg_try_advisory_lock(hashtextextended($1, 0))` on the
// Floor's pinned connection and Unlock `SELECT
// pg_advisory_unlock(hashtextextended($1, 0))`: session advisory locks, the
// primitive the driver builds on, with no expiry (the TTL is not applied), no
// fencing and no token (a session's lock is its own).
func PostgresFloors(u *url.URL) (FloorOpener, error) {
	cfg, err := postgresConfig(u, "floor")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (Floor, error) {
		c, err := pgx.ConnectConfig(ctx, cfg.Copy())
		if err != nil {
			return nil, fmt.Errorf("bench: postgres floor: %w", err)
		}
		return &postgresFloor{c: c}, nil
	}, nil
}

// postgresConfig is the pgx connection configuration for a postgres:// or
// postgresql:// URL, as PostgresFloors describes; what names the floor or
// peer in errors.
func postgresConfig(u *url.URL, what string) (*pgx.ConnConfig, error) {
	if u == nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("bench: the postgres %s needs a postgres:// or postgresql:// URL", what)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("bench: the postgres %s cannot use the URL: malformed query", what)
	}
	if _, err := dlock.OptionsFromQuery(q); err != nil { // deletes dlock's parameters
		return nil, err
	}
	for k := range q {
		if k == "prefix" || k == "fencing" || k == "session_pooler" || k == "fence_schema" || strings.HasPrefix(k, "pool_") {
			delete(q, k)
		}
	}
	cp := *u
	cp.RawQuery, cp.Fragment = q.Encode(), ""
	cfg, err := pgx.ParseConfig(cp.String())
	if err != nil {
		// pgx's errors leave the password out; the URL is not repeated.
		return nil, fmt.Errorf("bench: the postgres %s cannot use the URL (malformed host, port or libpq parameter)", what)
	}
	return cfg, nil
}

type postgresFloor struct{ c *pgx.Conn }

// floorStatementTimeout bounds one floor statement. A statement is not given
// the caller's ctx: pgx closes the connection, and with it the session and
// its locks, when a ctx ends mid-statement, and the runner ends ctxs at the
// end of every round; neither statement ever waits on the server.
const floorStatementTimeout = 10 * time.Second

func (f *postgresFloor) TryLock(ctx context.Context, name, _ string, _ time.Duration) (bool, error) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), floorStatementTimeout)
	defer cancel()
	var ok bool
	err := f.c.QueryRow(qctx, "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", name).Scan(&ok)
	return ok, err
}

func (f *postgresFloor) Unlock(ctx context.Context, name, _ string) error {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), floorStatementTimeout)
	defer cancel()
	var ok bool
	return f.c.QueryRow(qctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", name).Scan(&ok)
}

func (f *postgresFloor) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return f.c.Close(ctx)
}
