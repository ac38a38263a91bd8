package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// startSweep starts the sweep if it is not running; d.mu is held.
func (d *driver) startSweep() {
	if !d.sweeping {
		d.sweeping = true
		d.wg.Add(1)
		go d.sweep()
	}
}

// parked is a connection that a released lease left set up (see park).
type parked struct {
	c    *pgxpool.Conn
	ms   string    // its idle_session_timeout, in milliseconds
	orig [2][]byte // its settings before: idle_session_timeout, synchronous_commit
	at   time.Time // when it was parked
}

// A released lease's connection may be parked instead of going back to the
// pool with its settings restored: the release then only unlocks, and the
// next acquisition on it, of the same TTL, only locks; neither changes a
// setting, which saves the server work on every handoff (on PostgreSQL 15, a
// transaction that changed a setting walks them all as it ends). A parked
// connection stays out of the pool for two watchDelays at most: the sweep
// then restores its settings and hands it back. Only sessions whose
// idle_session_timeout is at least parkMinTTL are parked (the server must
// not end them meanwhile), and at most maxParked connections at a time: a
// quarter of the pool's MaxConns, so none from a pool of fewer than four
// (pgxpool's default is four or the number of CPUs).
//
// reserve claims a place for a connection about to be parked; park parks
// it, unreserve gives the place up.
func (d *driver) reserve() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || len(d.parked)+d.parking >= d.maxParked {
		return false
	}
	d.parking++
	return true
}

func (d *driver) unreserve() {
	d.mu.Lock()
	d.parking--
	d.mu.Unlock()
}

// park also forgets h, the lease the connection was released from.
func (d *driver) park(p parked, h *lease) {
	h.freePlace()
	d.mu.Lock()
	d.parking--
	delete(d.leases, h)
	d.reparkLocked(p)
}

// repark parks p again (an acquisition that took it found the lock busy);
// once the driver is closed, it closes p's connection instead.
func (d *driver) repark(p parked) {
	d.mu.Lock()
	d.reparkLocked(p)
}

// reparkLocked is repark with d.mu held; it unlocks d.mu.
func (d *driver) reparkLocked(p parked) {
	if d.closed {
		d.mu.Unlock()
		discard(p.c)
		return
	}
	d.parked = append(d.parked, p)
	d.startSweep()
	d.mu.Unlock()
}

// unpark takes the connection parked last, if any, unless the sweep is
// late to hand it back (its session nears its idle_session_timeout).
func (d *driver) unpark() (parked, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(d.parked)
	if n == 0 || time.Since(d.parked[n-1].at) >= parkMinTTL/2 {
		return parked{}, false
	}
	p := d.parked[n-1]
	d.parked[n-1] = parked{}
	d.parked = d.parked[:n-1]
	return p, true
}

// unparkOld takes the connections parked for watchDelay or longer.
func (d *driver) unparkOld(now time.Time, into []parked) []parked {
	d.mu.Lock()
	defer d.mu.Unlock()
	kept := d.parked[:0]
	for _, p := range d.parked {
		if now.Sub(p.at) >= watchDelay {
			into = append(into, p)
		} else {
			kept = append(kept, p)
		}
	}
	clear(d.parked[len(kept):])
	d.parked = kept
	return into
}

// restoreSQL gives a parked connection's session its settings back.
const restoreSQL = "SELECT set_config('idle_session_timeout', $1, false), set_config('synchronous_commit', $2, false)"

// unparkTo hands a parked connection back to the pool, its settings
// restored, or closes it if they could not be.
func unparkTo(p parked) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_, err := p.c.Conn().PgConn().ExecParams(ctx, restoreSQL, p.orig[:], nil, nil, nil).Close()
	if err != nil {
		discard(p.c)
		return
	}
	p.c.Release()
}

// sweep runs while the driver has leases or parked connections: every
// watchDelay it has each lease look at its connection (lease.sweep) and
// hands the connections parked since the last time back to the pool. One
// goroutine and one ticker per driver, rather than a timer per lease, keep
// an acquisition cheap.
func (d *driver) sweep() {
	defer d.wg.Done()
	t := time.NewTicker(watchDelay)
	defer t.Stop()
	var batch []*lease
	var old []parked
	for {
		select {
		case <-d.closing:
			return
		case <-t.C:
		}
		old = d.unparkOld(time.Now(), old[:0])
		for _, p := range old {
			unparkTo(p)
		}
		clear(old)
		d.mu.Lock()
		if len(d.leases) == 0 && len(d.parked) == 0 && d.parking == 0 {
			d.sweeping = false
			d.mu.Unlock()
			return
		}
		batch = batch[:0]
		for h := range d.leases {
			batch = append(batch, h)
		}
		d.mu.Unlock()
		now := time.Now()
		for _, h := range batch {
			h.sweep(now)
		}
		clear(batch)
	}
}

func (d *driver) untrack(h *lease) {
	h.freePlace()
	d.mu.Lock()
	delete(d.leases, h)
	d.mu.Unlock()
}
