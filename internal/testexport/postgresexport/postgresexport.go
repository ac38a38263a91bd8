// Package postgresexport holds package postgres's unexported functions for the
// tests module; package postgres sets them at init (see ../doc.go).
package postgresexport

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

var (
	// OIDAdvisoryUnlock is the OID the driver calls pg_advisory_unlock(bigint) by.
	OIDAdvisoryUnlock uint32
	// FastUnlock is the driver's fastUnlock with a message of its own.
	FastUnlock func(ctx context.Context, pg *pgconn.PgConn, key []byte) (bool, error)
	// RunListening runs sql (no parameters, one int4 column) as the driver's
	// stmt.runListening does.
	RunListening func(ctx context.Context, pg *pgconn.PgConn, sql string) (notified bool, err error)
	// KeepAlive is the driver's keepAlive.
	KeepAlive func(ctx context.Context, pg *pgconn.PgConn) error
)
