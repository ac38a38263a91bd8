package etcd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Records (dlockdriver.Recorder, for dlock.Once): the record of the name N
// is the key P%record/N (N escaped as in the lock's keys), bound to an etcd
// lease of its own whose TTL is the retention, so that the server deletes
// it then. It is put in a transaction that compares the holder's key's
// create revision (the lease's fence): a holder whose key is gone writes
// nothing. etcd keeps it across restarts (an etcd lease's TTL starts again
// when a new leader takes over, so a record may be kept a little longer).
// No name escapes to "%record" (escape writes '%' as "%25"), and Names
// skips the namespace.
const recordSpace = "%record/"

// recordKey is the record's key for the escaped name esc.
func (d *driver) recordKey(esc string) string { return d.prefix + recordSpace + esc }

// Record puts h's record if h's key is still there, in one transaction.
func (d *driver) Record(ctx context.Context, h dlockdriver.Handle, value string, ttl time.Duration) error {
	eh, ok := h.(*handle)
	if !ok || eh.d != d {
		return fmt.Errorf("%w: etcd: Record takes a lock's handle of this driver", dlock.ErrInvalid)
	}
	d.reg.mu.Lock()
	cmp := eh.isOurs()
	d.reg.mu.Unlock()
	// The lock's key is P N/<token>, N escaped (keys).
	esc := strings.TrimPrefix(eh.key, d.prefix)
	if i := strings.LastIndexByte(esc, '/'); i >= 0 {
		esc = esc[:i]
	}
	key := d.recordKey(esc)
	g, err := d.c.Grant(ctx, seconds(ttl))
	if err != nil {
		return fmt.Errorf("etcd: granting the lease of the record %q: %w", key, err)
	}
	resp, err := d.c.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, value, clientv3.WithLease(g.ID))).Commit()
	if err != nil {
		// Perhaps put: the etcd lease stays, and ends at the retention.
		return fmt.Errorf("etcd: recording %q: %w", key, err)
	}
	if !resp.Succeeded {
		d.revokeNow(&lease{id: g.ID, granted: time.Duration(g.TTL) * time.Second, sent: time.Now()})
		return fmt.Errorf("%w: etcd: recording %q: the lock's key %q is gone", dlock.ErrNotHeld, key, eh.key)
	}
	return nil
}

// Recorded reads name's record (a linearizable read).
func (d *driver) Recorded(ctx context.Context, name string) (string, bool, error) {
	key := d.recordKey(escape(name))
	resp, err := d.c.Get(ctx, key)
	if err != nil {
		return "", false, fmt.Errorf("etcd: reading %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", false, nil
	}
	return string(resp.Kvs[0].Value), true, nil
}
