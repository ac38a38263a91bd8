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
