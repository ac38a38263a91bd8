package etcd

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxIdle bounds the idle etcd leases a Locker keeps per TTL.
const maxIdle = 16

// revokeTimeout bounds the revocation of an etcd lease nobody uses any more
// (it expires at its TTL anyway).
const revokeTimeout = 2 * time.Second

// lease is one etcd lease. A lock's key is bound to its Locker's shared
// etcd lease of its TTL (shared.go) unless Options.LeasePerLock is set; an
// etcd lease of any other kind (a permit's, a reader's or writer's, or a
// lock's with LeasePerLock) belongs at any time to exactly one dlock lease,
// one acquisition in progress, or the Locker's idle pool, so that its
// expiry is one lease's loss.
type lease struct {
	id      clientv3.LeaseID
	sec     int64         // the TTL asked for, in seconds: the pool's key
	shared  bool          // a Locker's shared etcd lease (shared.go): never pooled nor revoked alone
	granted time.Duration // the TTL the server granted (it raises short ones)

	mu   sync.Mutex
	sent time.Time // when the request that set the lease's current expiry was sent
}

// lastSent is when the request that set the lease's current expiry was sent:
// the server keeps the lease at least until lastSent + granted.
func (l *lease) lastSent() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent
}

func (l *lease) renewed(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sent.After(l.sent) {
		l.sent = sent
	}
}

// validUntil is the conservative end of the lease's life, with the default
// drift margin of dlock.
func (l *lease) validUntil() time.Time {
	return l.lastSent().Add(l.granted - l.granted/100 - 2*time.Millisecond)
}

// errLeaseGone reports that an etcd lease has expired or was revoked.
var errLeaseGone = rpctypes.ErrLeaseNotFound

// leaseGone reports whether err says the etcd lease no longer exists.
func leaseGone(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}

// seconds turns a TTL into etcd's whole seconds, rounding up: a TTL is never
// shortened.
func seconds(ttl time.Duration) int64 {
	return max(1, int64((ttl+time.Second-1)/time.Second))
}

// takeLease returns an etcd lease of sec seconds with at least two thirds of
// its TTL left: an idle one from the pool (renewed first when it has aged
// past a third of its TTL) or a new one.
func (d *driver) takeLease(ctx context.Context, sec int64) (*lease, error) {
	for {
		d.mu.Lock()
		idle := d.pool[sec]
		var l *lease
		if n := len(idle); n > 0 {
			l = idle[n-1]
			d.pool[sec] = idle[:n-1]
		}
		d.mu.Unlock()
		if l == nil {
			break
		}
		age := time.Since(l.lastSent())
		switch {
		case age < l.granted/3:
			return l, nil
		case age < l.granted*2/3:
			err := d.keepAlive(ctx, l)
			if err == nil {
				return l, nil
			}
			if !leaseGone(err) {
				d.revoke(l)
				return nil, err
			}
		default:
			// Too close to its expiry, or past it: a new one costs the same
			// round trip as a renewal.
			d.revoke(l)
		}
	}
	return d.grantLease(ctx, sec)
}

// grantLease asks the server for a new etcd lease of sec seconds.
func (d *driver) grantLease(ctx context.Context, sec int64) (*lease, error) {
	sent := time.Now()
	resp, err := d.c.Grant(ctx, sec)
	if err != nil {
		return nil, err
	}
	return &lease{id: resp.ID, sec: sec, granted: time.Duration(resp.TTL) * time.Second, sent: sent}, nil
}

// keepAlive renews l once. It fails with an error matching errLeaseGone when
// the lease has expired or was revoked.
func (d *driver) keepAlive(ctx context.Context, l *lease) error {
	sent := time.Now()
	resp, err := d.c.KeepAliveOnce(ctx, l.id)
	if err != nil {
		return err
	}
	if resp.TTL <= 0 {
		return errLeaseGone
	}
	l.renewed(sent)
	return nil
}

// putLease gives an etcd lease that carries no key back to the pool.
func (d *driver) putLease(l *lease) {
	if l.shared {
		return
	}
	now := time.Now()
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.revoke(l)
		return
	}
	// Drop the leases that have expired meanwhile (the oldest are first).
	idle := d.pool[l.sec]
	i := 0
	for i < len(idle) && now.Sub(idle[i].lastSent()) >= idle[i].granted {
		i++
	}
	idle = append(idle[i:], l)
	var extra *lease
	if len(idle) > maxIdle {
		extra, idle = idle[0], idle[1:]
	}
	d.pool[l.sec] = idle
	d.mu.Unlock()
	if extra != nil {
		d.revoke(extra)
	}
}

// revoke revokes an etcd lease in the background, best effort: it expires at
// its TTL anyway. Revoking deletes the keys attached to it. Close waits for
// revocations in flight.
func (d *driver) revoke(l *lease) {
	if l.shared {
		return // others' keys are on it; Close revokes it
	}
	d.revokeNow(l)
}

// revokeNow is revoke of any etcd lease, shared or not.
func (d *driver) revokeNow(l *lease) {
	if time.Since(l.lastSent()) >= l.granted {
		return // expired already
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
		defer cancel()
		_, _ = d.c.Revoke(ctx, l.id)
	}()
}

// drainPool empties the pool and revokes its leases.
func (d *driver) drainPool() {
	d.mu.Lock()
	d.closed = true
	pool := d.pool
	d.pool = nil
	d.mu.Unlock()
	for _, idle := range pool {
		for _, l := range idle {
			d.revoke(l)
		}
	}
	d.stopWatch()
	d.reg.mu.Lock()
	shared := d.reg.shared
	d.reg.shared = nil
	d.reg.mu.Unlock()
	for _, l := range shared {
		d.revokeNow(l)
	}
}

// lockLease returns the etcd lease for a lock's key of sec seconds: the
// shared one, or with Options.LeasePerLock one of its own.
func (d *driver) lockLease(ctx context.Context, sec int64) (*lease, error) {
	if d.perLock {
		return d.takeLease(ctx, sec)
	}
	return d.takeShared(ctx, sec)
}
