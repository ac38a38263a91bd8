package postgres

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
)

//go:embed inspect.sql
var inspectSQL string

// Inspect describes name (dlockdriver.Inspector) from pg_locks: whether a
// session holds its advisory lock (Holder: that backend's pid and
// application name), and how many sessions wait for it. The server stores
// no token, metadata, grant time or fence per lock, and a lock lives as long
// as its session: those fields stay unknown. Advisory keys are hashes of
// names, so the driver cannot list names (no Lister).
func (d *driver) Inspect(ctx context.Context, name string) (dlockdriver.LockInfo, error) {
	info := dlockdriver.LockInfo{Name: name, TTL: -1}
	rows, err := d.pool.Query(ctx, inspectSQL, d.prefix+name)
	if err != nil {
		return info, fmt.Errorf("postgres: inspecting %q: %w", name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			granted bool
			pid     int32
			start   *time.Time
			app     *string
		)
		if err := rows.Scan(&granted, &pid, &start, &app); err != nil {
			return info, fmt.Errorf("postgres: inspecting %q: %w", name, err)
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
	}
	if err := rows.Err(); err != nil {
		return info, fmt.Errorf("postgres: inspecting %q: %w", name, err)
	}
	return info, nil
}
