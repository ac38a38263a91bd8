package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A lock's metadata (Options.Metadata; the candidate of a leader election)
// is a row of the table dlock_metadata, in the fencing schema, written by
// the lease's session after a grant whose metadata is not empty, and
// deleted before its release (see metadata.sql). The server keeps nothing
// per advisory lock but its holder's pid, so Inspect reads the holder's
// metadata, fencing token and grant time there. A lease without metadata
// never touches the table.
const metadataTable = "dlock_metadata"

var (
	//go:embed metadata.sql
	metadataFile string
	//go:embed metadata_drop.sql
	metadataDropFile string
	//go:embed inspect_metadata.sql
	inspectMetadataFile string
)

// metadataStmts are the metadata statements with the Locker's table in
// place.
type metadataStmts struct {
	store, drop, inspect string
}

func newMetadataStmts(f fenceObjects) *metadataStmts {
	r := strings.NewReplacer("{{table}}", f.meta)
	return &metadataStmts{
		store:   r.Replace(statement("metadata.sql", metadataFile)),
		drop:    r.Replace(statement("metadata_drop.sql", metadataDropFile)),
		inspect: r.Replace(statement("inspect_metadata.sql", inspectMetadataFile)),
	}
}

// storeMetadata records h's metadata (metadata.sql) on its session; the
// first time the table turns out missing, it is created (under the
// fencing objects' advisory lock) and the row written again.
func (d *driver) storeMetadata(ctx context.Context, h *lease, fence uint64, metadata string) error {
	for created := false; ; created = true {
		_, err := h.c.Exec(ctx, d.meta.store, d.prefix+h.name, int64(fence), metadata)
		if err == nil || created || !isCode(err, "42P01") { // undefined_table
			return err
		}
		err = pgx.BeginFunc(ctx, h.c.Conn(), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", fenceLockKey)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, d.fence.metaSQL())
			return err
		})
		if err != nil {
			return d.fenceError(err)
		}
	}
}

// dropMetadata deletes the row of h's session after its release, and
// notifies the lock's watchers (metadata_drop.sql).
func (h *lease) dropMetadata(ctx context.Context) error {
	_, err := h.c.Exec(ctx, h.d.meta.drop, h.d.prefix+h.name)
	return err
}

// Watch implements dlockdriver.Notifier for the releases of leases with
// metadata (the leaders of elections: Locker.Observe watches with it),
// which notify on the channel dlock_lock_<key in hex> (metadata_drop.sql)
// once released. A lock without metadata releases without a notification
// (its release stays one round trip), and a session's end (expiry, crash)
// sends none: a watcher of those learns of them by looking again. The
// watch holds a connection of the pool, listening, until stop.
func (d *driver) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: watching %q: %w", name, err)
	}
	pg := c.Conn().PgConn()
	var channel string
	err = c.QueryRow(ctx, "SELECT 'dlock_lock_' || to_hex(hashtextextended($1, 0))", d.prefix+name).Scan(&channel)
	if err == nil {
		_, err = pg.Exec(ctx, `LISTEN "`+channel+`"`).ReadAll()
	}
	if err != nil {
		discard(c)
		return nil, nil, fmt.Errorf("postgres: watching %q: %w", name, err)
	}
	fired, done := make(chan struct{}), make(chan struct{})
	var stopping atomic.Bool
	go func() {
		defer close(done)
		// A notification, or the connection failing: look again.
		_ = pg.WaitForNotification(context.Background())
		if !stopping.Load() {
			close(fired)
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopping.Store(true)
			_ = pg.Conn().SetReadDeadline(time.Now())
			<-done
			if pg.IsClosed() {
				c.Release()
				return
			}
			_ = pg.Conn().SetReadDeadline(time.Time{})
			ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			defer cancel()
			if _, err := pg.Exec(ctx, `UNLISTEN "`+channel+`"`).ReadAll(); err != nil {
				discard(c)
				return
			}
			c.Release()
		})
	}
	return fired, stop, nil
}

// noMetadataTable reports an Inspect that cannot read the table: missing
// (no metadata was ever stored) or not readable by this role.
func noMetadataTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "42501")
}
