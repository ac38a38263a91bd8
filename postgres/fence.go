package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Fencing tokens come from one sequence per database, dlock_fence_seq,
// taken with nextval after the grant; a table, dlock_fence_epoch, records
// the server's starts. See the package doc (Guarantees) for why both.
const (
	fenceSeq   = "dlock_fence_seq"
	fenceEpoch = "dlock_fence_epoch"
	// DefaultFenceSchema is the schema of the fencing sequence and table
	// unless Options.FenceSchema names another.
	DefaultFenceSchema = "public"
	// EpochGap is how far the fencing sequence is moved forward, once per
	// server start, before any token of that start is handed out: past every
	// token that a crash could have taken back (those whose sequence record
	// had not reached the disk).
	EpochGap = 1 << 32
)

// epochChecked marks, in a connection's CustomData, that the server start
// the connection belongs to has its epoch on disk. A connection never
// outlives its server's start, so once per connection is enough.
const epochChecked = "dlock/postgres.epoch"

// fenceObjects are the SQL names of the sequence and the epoch table.
type fenceObjects struct {
	seq, epoch string // quoted and schema-qualified
	seqLit     string // seq as a string literal, for nextval
	meta       string // the metadata table (metadata.go), quoted and schema-qualified
}

func newFenceObjects(schema string) fenceObjects {
	seq := pgx.Identifier{schema, fenceSeq}.Sanitize()
	return fenceObjects{
		seq:    seq,
		epoch:  pgx.Identifier{schema, fenceEpoch}.Sanitize(),
		seqLit: "'" + strings.ReplaceAll(seq, "'", "''") + "'",
		meta:   pgx.Identifier{schema, metadataTable}.Sanitize(),
	}
}

// createSQL makes the objects if they are missing; it runs under an
// advisory transaction lock (concurrent CREATE ... IF NOT EXISTS can fail
// on the catalogs' unique indexes).
func (f fenceObjects) createSQL() []string {
	return []string{
		fmt.Sprintf("CREATE SEQUENCE IF NOT EXISTS %s AS bigint", f.seq),
		fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (started timestamptz PRIMARY KEY, moved_to bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())", f.epoch),
		f.metaSQL(),
	}
}

// metaSQL makes the metadata table (metadata.sql) if it is missing.
func (f fenceObjects) metaSQL() string {
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (pid int4 PRIMARY KEY, backend_start timestamptz NOT NULL, key text NOT NULL, fence bigint NOT NULL, since timestamptz NOT NULL, metadata text NOT NULL)", f.meta)
}

// DDL is what a database administrator runs, once per database, for a role
// that may not create the fencing sequence and tables itself (the driver
// creates them on first use otherwise); the role then needs USAGE and
// UPDATE on the sequence, SELECT and INSERT on the table dlock_fence_epoch,
// and, to store locks' metadata (Options.Metadata, leader election) and
// the records of dlock.Locker.Once, SELECT, INSERT, UPDATE and DELETE on
// the tables dlock_metadata and dlock_records.
func DDL(schema string) string {
	if schema == "" {
		schema = DefaultFenceSchema
	}
	f := newFenceObjects(schema)
	return strings.Join(append(f.createSQL(), recordsSQL(f.records())), ";\n") + ";\n"
}

// fenceLockKey is the advisory transaction lock under which the objects
// are created and the epoch written ("dlock" and a tag, in ASCII).
const fenceLockKey int64 = 0x646c6f636b0e0c01

// ensureEpoch makes sure that the server start c belongs to has its epoch
// on disk before c hands out a token: the first connection after a start
// moves the sequence EpochGap forward and records the start, in a
// transaction whose commit is flushed. It costs a round trip per
// connection, and a flushed transaction per server start.
func (d *driver) ensureEpoch(ctx context.Context, c *pgx.Conn) error {
	data := c.PgConn().CustomData()
	if data[epochChecked] == true {
		return nil
	}
	var ok, missing bool
	err := c.QueryRow(ctx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE started = pg_postmaster_start_time())", d.fence.epoch)).Scan(&ok)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "42P01": // undefined_table: first use
		missing = true
	case err != nil:
		return d.fenceError(err)
	}
	if !ok {
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			// The commit must be flushed before any token of this start is
			// handed out: at least synchronous_commit=local.
			stmts := []string{
				"SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'local' ELSE current_setting('synchronous_commit') END, true)",
				fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", fenceLockKey),
			}
			if missing { // CREATE ... IF NOT EXISTS needs the right to create
				stmts = append(stmts, d.fence.createSQL()...)
			}
			stmts = append(stmts, fmt.Sprintf(
				`INSERT INTO %s (started, moved_to)
				 SELECT pg_postmaster_start_time(), setval(%s, nextval(%[2]s) + %d)
				 WHERE NOT EXISTS (SELECT 1 FROM %[1]s WHERE started = pg_postmaster_start_time())`,
				d.fence.epoch, d.fence.seqLit, EpochGap))
			for _, s := range stmts {
				if _, err := tx.Exec(ctx, s); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return d.fenceError(err)
		}
	}
	data[epochChecked] = true
	return nil
}

func (d *driver) fenceError(err error) error {
	return fmt.Errorf("postgres: fencing needs the sequence %s and the table %s (created on first use; without the right to create them, run postgres.DDL once as an administrator, or turn fencing off): %w", d.fence.seq, d.fence.epoch, err)
}
