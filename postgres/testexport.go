package postgres

import (
	"context"

	"github.com/dlock/dlock/internal/testexport/postgresexport"
	"github.com/jackc/pgx/v5/pgconn"
)

func init() {
	postgresexport.OIDAdvisoryUnlock = oidAdvisoryUnlock
	postgresexport.FastUnlock = func(ctx context.Context, pg *pgconn.PgConn, key []byte) (bool, error) {
		return fastUnlock(ctx, pg, new(unlockCall), key)
	}
	postgresexport.RunListening = func(ctx context.Context, pg *pgconn.PgConn, sql string) (bool, error) {
		return newStmt(sql, nil, []uint32{oidInt4}).runListening(ctx, pg, nil, ignoreRow{})
	}
	postgresexport.KeepAlive = keepAlive
}

type ignoreRow struct{}

func (ignoreRow) decode([][]byte) error { return nil }
