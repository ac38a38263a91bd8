package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/jackc/pgx/v5"
)

// Records (dlockdriver.Recorder, for dlock.Once) are rows of the table
// dlock_records (key text primary key: KeyPrefix || name, value, expires),
// in the fencing schema, created on first use. The lease's own session
// writes its record (record.sql) in the statement that checks pg_locks for
// its advisory lock, so a session that lost the lock writes nothing; the
// commit is flushed. Expiry is the server's clock: a record past its
// expires is not read, and each write deletes a few of those. A role that
// may not create tables needs the table made by DDL.
const recordsTable = "dlock_records"

// recordsSQL makes the records table if it is missing.
func recordsSQL(table string) string {
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (key text PRIMARY KEY, value text NOT NULL, expires timestamptz NOT NULL)", table)
}

//go:embed record.sql
var recordFile string

var recordSQL = strings.ReplaceAll(statement("record.sql", recordFile), "{{match}}", lockMatch)

// records is the records table's quoted, schema-qualified name.
func (d *driver) records() string { return d.fence.records() }

// records is the records table of the fencing schema, quoted.
func (f fenceObjects) records() string {
	return strings.TrimSuffix(f.meta, pgx.Identifier{metadataTable}.Sanitize()) + pgx.Identifier{recordsTable}.Sanitize()
}

// Record writes h's record on its session if the session still holds the
// lock; the first time the table turns out missing, it is created and the
// record written again.
func (d *driver) Record(ctx context.Context, h dlockdriver.Handle, value string, ttl time.Duration) error {
	stmt := strings.ReplaceAll(recordSQL, "{{table}}", d.records())
	ms := ttl.Milliseconds()
	for created := false; ; created = true {
		var err error
		switch h := h.(type) {
		case *lease:
			if h.d != d || h.ks != nil {
				return errNotLock
			}
			err = h.record(ctx, stmt, value, ms)
		case *sharedLease:
			if h.s.set.d != d {
				return errNotLock
			}
			err = h.record(ctx, stmt, value, ms)
		default:
			return errNotLock
		}
		if created || !isCode(err, "42P01") { // undefined_table
			return err
		}
		if err := d.createRecords(ctx); err != nil {
			return err
		}
	}
}

var errNotLock = fmt.Errorf("%w: postgres: Record takes a lock's handle of this driver", dlock.ErrInvalid)

// createRecords makes the records table, under the fencing objects'
// advisory lock (concurrent CREATE ... IF NOT EXISTS can fail).
func (d *driver) createRecords(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", fenceLockKey)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, recordsSQL(d.records()))
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: creating the records table %s (without the right to create it, run postgres.DDL once as an administrator): %w", d.records(), err)
	}
	return nil
}

// Recorded reads name's record, if it has not expired.
func (d *driver) Recorded(ctx context.Context, name string) (string, bool, error) {
	var v string
	err := d.pool.QueryRow(ctx, fmt.Sprintf("SELECT value FROM %s WHERE key = $1 AND expires > now()", d.records()), d.prefix+name).Scan(&v)
	switch {
	case errors.Is(err, pgx.ErrNoRows), isCode(err, "42P01"):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("postgres: reading the record of %q: %w", name, err)
	}
	return v, true, nil
}

// record runs record.sql on the lease's session, as Held runs held.sql.
func (h *lease) record(ctx context.Context, stmt, value string, ttlMillis int64) error {
	if err := h.begin(); err != nil {
		return h.notHeld("record", err)
	}
	h.mu.Lock()
	left := time.Until(h.lastSent.Add(h.ttl))
	h.mu.Unlock()
	ms, _ := millis(max(left, time.Millisecond))
	var pid int32
	var written *bool
	var idle, sync *string
	h.ms = "" // whatever comes of it
	_, err := h.cw.cancellable(ctx, h.pg, h.opLimit(0), func() error {
		return h.c.QueryRow(context.Background(), stmt, h.pid, h.d.prefix+h.name, ms, value, ttlMillis).Scan(&pid, &written, &idle, &sync)
	})
	if err != nil {
		if h.fail(err) {
			return h.notHeld("record", err)
		}
		h.end(time.Time{}, 0, false)
		return h.stmtError(ctx, "record", err)
	}
	defer h.end(time.Time{}, 0, false)
	if err := h.checkPID("record", pid); err != nil {
		return err
	}
	if written == nil || !*written {
		h.giveUp() // the session no longer holds the lock
		return h.notHeld("record", errors.New("the session no longer holds the lock"))
	}
	return nil
}

// record runs record.sql on the shared session, as Held runs held.sql.
func (h *sharedLease) record(ctx context.Context, stmt, value string, ttlMillis int64) error {
	sess := h.s
	var (
		written *bool
		pid     int32
		gone    bool
		err     error
	)
	op := func() {
		sess.mu.Lock()
		gone = h.gone || sess.gone
		ms, _ := millis(sess.ttl)
		sess.mu.Unlock()
		if gone {
			return
		}
		var idle, sync *string
		err = sess.c.Conn().QueryRow(context.Background(), stmt, sess.pid, h.key, ms, value, ttlMillis).Scan(&pid, &written, &idle, &sync)
		if err != nil {
			sess.failed(err)
		}
	}
	if _, cerr := sess.call(ctx, op, nil); cerr != nil {
		return fmt.Errorf("postgres: record of %q: %w", h.name, cerr)
	}
	switch {
	case gone:
		return h.notHeld("record", errSessionGone)
	case err != nil && sess.isGone():
		return h.notHeld("record", err)
	case err != nil:
		return fmt.Errorf("postgres: record of %q: %w", h.name, err)
	case pid != sess.pid:
		return h.notHeld("record", fmt.Errorf("%w: lease taken on backend %d, record ran on backend %d", ErrPooler, sess.pid, pid))
	case written == nil || !*written:
		return h.notHeld("record", errors.New("the session no longer holds the lock"))
	}
	return nil
}
