package postgres

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/jackc/pgx/v5"
)

//go:embed inspect.sql
var inspectSQL string

// Inspect describes name (dlockdriver.Inspector) from pg_locks: whether a
// session holds its advisory lock (Holder: that backend's pid and
// application name), and how many sessions wait for it. A holder whose
// lease has metadata recorded it with its fencing token and grant time
// (metadata.go), which Inspect then reports (Metadata, Fence, Since); the
// server stores nothing else per lock, and a lock lives as long as its
// session: the token and TTL stay unknown. Advisory keys are hashes of
// names, so the driver cannot list names (no Lister).
func (d *driver) Inspect(ctx context.Context, name string) (dlockdriver.LockInfo, error) {
	info := dlockdriver.LockInfo{Name: name, TTL: -1}
	withMeta := d.meta != nil
	sql := inspectSQL
	if withMeta {
		sql = d.meta.inspect
	}
	rows, err := d.pool.Query(ctx, sql, d.prefix+name)
	if err == nil {
		info, err = d.inspectRows(rows, info, withMeta)
	}
	if err != nil && withMeta && noMetadataTable(err) {
		// No metadata was ever stored (no table), or this role may not
		// read it: the holder alone.
		withMeta = false
		if rows, err = d.pool.Query(ctx, inspectSQL, d.prefix+name); err == nil {
			info, err = d.inspectRows(rows, dlockdriver.LockInfo{Name: name, TTL: -1}, false)
		}
	}
	if err != nil {
		return info, fmt.Errorf("postgres: inspecting %q: %w", name, err)
	}
	return info, nil
}

func (d *driver) inspectRows(rows pgx.Rows, info dlockdriver.LockInfo, withMeta bool) (dlockdriver.LockInfo, error) {
	defer rows.Close()
	for rows.Next() {
		var (
			granted bool
			pid     int32
			start   *time.Time
			app     *string
			meta    *string
			fence   *int64
			since   *time.Time
		)
		dest := []any{&granted, &pid, &start, &app}
		if withMeta {
			dest = append(dest, &meta, &fence, &since)
		}
		if err := rows.Scan(dest...); err != nil {
			return info, err
		}
		if !granted {
			info.Waiters++
			continue
		}
		info.Held = true
		info.Holder = fmt.Sprintf("pid %d", pid)
		if app != nil && *app != "" {
			info.Holder += " (" + *app + ")"
		}
		if meta != nil {
			info.Metadata = *meta
		}
		if fence != nil {
			info.Fence, info.HasFence = uint64(*fence), true
		}
		if since != nil {
			info.Since = *since
		}
	}
	return info, rows.Err()
}
