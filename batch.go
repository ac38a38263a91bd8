package dlock

import (
	"context"
	"time"

	"github.com/dlock/dlock/driver"
)

// maxBatch bounds the leases refreshed in one driver request.
const maxBatch = 256

// refreshBatch is the watchdog for a batch of leases whose ticks fell due
// together (see sched), on a driver.BatchRefresher: one request per
// maxBatch leases instead of one per lease. Each lease is refreshed as
// onTick would: under its ops, bounded by its ValidUntil (the request by
// the earliest of them), its outcome applied and failures retried alone.
// A lease whose ops are taken (a Refresh or Release of its holder in
// flight) has its tick run alone instead, so that it holds up no batch.
func (l *Locker) refreshBatch(lss []*Lease) {
	type item struct {
		ls    *Lease
		ttl   time.Duration
		until time.Time
	}
	items := make([]item, 0, len(lss))
	// Every request counts as sent when the leases' work bounds were
	// checked (see Lease.tickState), so that none is valid longer than TTL
	// past them; for a chunk after the first that is conservative by the
	// earlier chunks' round trips.
	now := time.Now()
	for _, ls := range lss {
		if !ls.enter() {
			continue
		}
		select {
		case ls.ops <- struct{}{}:
		default:
			go func() {
				defer l.bg.Done() // enter's count covers this goroutine
				ls.onTick()
			}()
			continue
		}
		ls.mu.Lock()
		stopped, until, ttl := ls.tickState(now)
		ls.mu.Unlock()
		if stopped {
			<-ls.ops
			ls.l.bg.Done()
			continue
		}
		items = append(items, item{ls, ttl, until})
	}
	br := l.d.(driver.BatchRefresher)
	for len(items) > 0 {
		chunk := items[:min(len(items), maxBatch)]
		items = items[len(chunk):]
		hs := make([]driver.Handle, len(chunk))
		ttls := make([]time.Duration, len(chunk))
		deadline := chunk[0].until
		for i, it := range chunk {
			hs[i], ttls[i] = it.ls.h, it.ttl
			if it.until.Before(deadline) {
				deadline = it.until
			}
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		sent := now
		granted, errs := br.RefreshBatch(ctx, hs, ttls)
		cancel()
		for i, it := range chunk {
			var (
				g   time.Duration
				err error
			)
			if i < len(granted) {
				g = granted[i]
			}
			if i < len(errs) {
				err = errs[i]
			}
			err = it.ls.applyRefresh(sent, it.ttl, g, err)
			<-it.ls.ops
			it.ls.afterTick(err, it.until)
			it.ls.l.bg.Done()
		}
	}
}
