package mysql

import (
	"context"
	"database/sql"
	"fmt"

	dlockdriver "github.com/dlock/dlock/driver"
)

// Inspect describes name (dlock/driver.Inspector): whether a session holds
// its user lock, and which (Holder: the connection id IS_USED_LOCK gives,
// with the session's user and host when this user may see it in the
// process list). The server stores nothing else per user lock: the fencing
// token is known only for a lease of this Locker (Fence), and the token,
// metadata, grant time and TTL stay unknown; waiters are unknown too (the
// server shows who waits in GET_LOCK only in its process list, where
// another user's sessions need PROCESS). User lock names are not listed
// (no Lister): MariaDB lists them only with the metadata_lock_info plugin
// installed.
func (d *driver) Inspect(ctx context.Context, name string) (dlockdriver.LockInfo, error) {
	info := dlockdriver.LockInfo{Name: name, TTL: -1, Waiters: -1}
	key := LockName(d.prefix, name)
	var (
		id         sql.NullInt64
		user, host sql.NullString
	)
	if err := d.db.QueryRowContext(ctx, fill(inspectSQL, "$KEY", literal(key))).Scan(&id, &user, &host); err != nil {
		return info, fmt.Errorf("mysql: inspecting %q: %w", name, err)
	}
	if !id.Valid {
		return info, nil
	}
	info.Held = true
	info.Holder = fmt.Sprintf("connection %d", id.Int64)
	if user.Valid {
		info.Holder += fmt.Sprintf(" (%s@%s)", user.String, host.String)
	}
	if l := d.leaseOf(key, id.Int64); l != nil && d.fencing {
		info.Fence, info.HasFence = l.fence, true
	}
	return info, nil
}

// leaseOf is the live lease of this driver that holds key on connection
// id, nil when the holder is another Locker's (or a raw client's). It looks
// at every lease: Inspect is for operators, not a hot path.
func (d *driver) leaseOf(key string, id int64) *lease {
	d.mu.Lock()
	defer d.mu.Unlock()
	for l := range d.leases {
		if l.key == key && l.connID == id {
			return l
		}
	}
	return nil
}
