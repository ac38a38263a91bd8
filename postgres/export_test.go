package postgres

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

// Internals for the tests of package postgres_test.
var OIDAdvisoryUnlock = oidAdvisoryUnlock

// FastUnlock is fastUnlock with a message of its own.
func FastUnlock(ctx context.Context, pg *pgconn.PgConn, key []byte) (bool, error) {
	return fastUnlock(ctx, pg, new(unlockCall), key)
}

// RunListening runs sql (no parameters, one int4 column) by
// stmt.runListening.
func RunListening(ctx context.Context, pg *pgconn.PgConn, sql string) (notified bool, err error) {
	return newStmt(sql, nil, []uint32{oidInt4}).runListening(ctx, pg, nil, ignoreRow{})
}

type ignoreRow struct{}

func (ignoreRow) decode([][]byte) error { return nil }

// KeepAlive is keepAlive.
func KeepAlive(ctx context.Context, pg *pgconn.PgConn) error { return keepAlive(ctx, pg) }
