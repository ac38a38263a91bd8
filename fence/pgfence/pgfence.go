// Package pgfence is a fence guard for data in PostgreSQL: a guard table
// keeps the highest fencing token accepted per resource, and [Guard.Check],
// run inside the transaction that writes the resource, refuses a stale token
// so that the check and the write commit (or roll back) together.
//
//	g, _ := pgfence.New("")                    // table dlock_fences
//	_ = g.CreateTable(ctx, pool)               // once, or g.DDL() in a migration
//	token, _ := fence.Token(lease)
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if err := g.Check(ctx, tx, "account:42", token); err != nil {
//			return err // errors.Is(err, fence.ErrStale): a newer holder has written
//		}
//		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = $1 WHERE id = 42", balance)
//		return err
//	})
//
// Check locks the resource's guard row until the transaction ends: a
// concurrent writer of the same resource waits, then sees the fence that
// committed and is refused if its own is lower. Under REPEATABLE READ or
// SERIALIZABLE that writer gets a serialization failure instead (retry the
// transaction, as for any such conflict). Called outside a transaction
// (on a pool or a connection in autocommit) the check commits on its own and
// protects nothing that follows it.
//
// The lease's lock name and the resource are the caller's to pair: compare
// fences of one lock name per resource (see package fence).
package pgfence

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlock/dlock/fence"
)

// DefaultTable is the guard table's name when New is given "".
const DefaultTable = "dlock_fences"

var (
	//go:embed create.sql
	createSQL string
	//go:embed check.sql
	checkSQL string
	//go:embed highest.sql
	highestSQL string
)

// Querier runs a query returning at most one row: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool have it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Execer runs a statement: pgx.Tx, *pgx.Conn and *pgxpool.Pool have it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SQLQuerier is Querier for database/sql: *sql.Tx and *sql.Conn have it.
type SQLQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Guard checks fences against one guard table.
type Guard struct {
	ddl, check, highest string
}

// New returns a guard on the table named table (DefaultTable when ""),
// which may be schema-qualified ("app.fences"). The name is quoted as given;
// an empty part is an error matching fence.ErrInvalid.
func New(table string) (*Guard, error) {
	if table == "" {
		table = DefaultTable
	}
	parts := strings.Split(table, ".")
	for _, p := range parts {
		if p == "" || strings.ContainsRune(p, 0) {
			return nil, fmt.Errorf("%w: table name %q", fence.ErrInvalid, table)
		}
	}
	quoted := pgx.Identifier(parts).Sanitize()
	fill := func(s string) string { return strings.ReplaceAll(s, "{{table}}", quoted) }
	return &Guard{ddl: fill(createSQL), check: fill(checkSQL), highest: fill(highestSQL)}, nil
}

// DDL is the statement that creates the guard table if it does not exist,
// for a migration.
func (g *Guard) DDL() string { return g.ddl }

// CreateTable creates the guard table if it does not exist; ctx bounds it.
func (g *Guard) CreateTable(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, g.ddl); err != nil {
		return fmt.Errorf("pgfence: creating the guard table: %w", err)
	}
	return nil
}

// Check records token as the fence of resource in tx, or returns a
// *fence.StaleError matching fence.ErrStale when a higher fence is recorded;
// the caller then rolls tx back. Call it in the transaction that writes the
// resource, before the write. ctx bounds the check, including its wait
// behind a concurrent transaction that checked the same resource.
func (g *Guard) Check(ctx context.Context, tx Querier, resource string, token uint64) error {
	if resource == "" {
		return fmt.Errorf("%w: empty resource", fence.ErrInvalid)
	}
	return g.result(resource, token,
		tx.QueryRow(ctx, g.check, resource, strconv.FormatUint(token, 10)),
		func() pgx.Row { return tx.QueryRow(ctx, g.highest, resource) }, pgx.ErrNoRows)
}

// CheckSQL is Check for a database/sql transaction.
func (g *Guard) CheckSQL(ctx context.Context, tx SQLQuerier, resource string, token uint64) error {
	if resource == "" {
		return fmt.Errorf("%w: empty resource", fence.ErrInvalid)
	}
	return g.result(resource, token,
		tx.QueryRowContext(ctx, g.check, resource, strconv.FormatUint(token, 10)),
		func() pgx.Row { return tx.QueryRowContext(ctx, g.highest, resource) }, sql.ErrNoRows)
}

// result reads the check's row: one row is an accepted token, none a
// refused one, reported with the fence that holds the resource.
func (g *Guard) result(resource string, token uint64, row pgx.Row, highest func() pgx.Row, noRows error) error {
	var s string
	err := row.Scan(&s)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, noRows):
		return fmt.Errorf("pgfence: checking fence %d of %q: %w", token, resource, err)
	}
	stale := &fence.StaleError{Resource: resource, Token: token}
	if err := highest().Scan(&s); err == nil {
		stale.Highest, _ = strconv.ParseUint(s, 10, 64)
	}
	return stale
}

// Highest returns the fence recorded for resource, and false when none is.
func (g *Guard) Highest(ctx context.Context, db Querier, resource string) (uint64, bool, error) {
	var s string
	switch err := db.QueryRow(ctx, g.highest, resource).Scan(&s); {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("pgfence: reading the fence of %q: %w", resource, err)
	}
	h, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("pgfence: fence of %q: %w", resource, err)
	}
	return h, true, nil
}
