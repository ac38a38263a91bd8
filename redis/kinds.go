package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
	"github.com/dlock/dlock/internal/redishub"
	goredis "github.com/redis/go-redis/v9"
)

// Semaphores and read/write locks (default layout only): each kind has keys
// of its own beside the lock's, in the same hash slot (see the package
// doc's Layout).

var (
	//go:embed permit_acquire.lua
	permitAcquireLua    string
	permitAcquireScript = goredis.NewScript(permitAcquireLua)

	//go:embed members_refresh.lua
	membersRefreshLua    string
	membersRefreshScript = goredis.NewScript(membersRefreshLua)

	//go:embed members_release.lua
	membersReleaseLua    string
	membersReleaseScript = goredis.NewScript(membersReleaseLua)

	//go:embed rw_acquire.lua
	rwAcquireLua    string
	rwAcquireScript = goredis.NewScript(rwAcquireLua)

	//go:embed rw_release.lua
	rwReleaseLua    string
	rwReleaseScript = goredis.NewScript(rwReleaseLua)
)

// reply kinds of permit_acquire.lua and rw_acquire.lua.
const (
	kindBusy     = 0
	kindGranted  = 1
	kindMismatch = 3
)

// permitKeys are a semaphore's keys, in permit_acquire.lua's order: the
// holders, the limit, the counter.
func (d *driver) permitKeys(name string) []string {
	b := d.prefix + "{" + name + "}:permits"
	return []string{b, b + ":limit", b + ":fence"}
}

// rwKeys are a read/write lock's keys, in rw_acquire.lua's order: the
// readers, the writer, the writers' waits, the write counter.
func (d *driver) rwKeys(name string) []string {
	b := d.prefix + "{" + name + "}:rw"
	return []string{b + ":readers", b + ":writer", b + ":waits", b + ":fence"}
}

// kindChannel is the channel on which releases of kind's object of name
// are announced: one for a semaphore, one for both sides of a read/write
// lock.
func (d *driver) kindChannel(k dlockdriver.Kind, name string) string {
	if k == dlockdriver.KindPermit {
		return d.prefix + "{" + name + "}:permits:released"
	}
	return d.prefix + "{" + name + "}:rw:released"
}

// tryKind makes one attempt at a permit or a side of a read/write lock;
// wait, for a writer, is the wait to register when it finds the lock busy.
func (d *driver) tryKind(ctx context.Context, req dlockdriver.Request, wait string) (*dlockdriver.Grant, error) {
	px := millis(req.TTL)
	var (
		cmd  *goredis.Cmd
		keys []string
	)
	switch req.Kind {
	case dlockdriver.KindPermit:
		keys = d.permitKeys(req.Name)
		cmd = permitAcquireScript.Run(ctx, d.c, keys, req.Token, px, req.Limit)
	case dlockdriver.KindRead, dlockdriver.KindWrite:
		keys = d.rwKeys(req.Name)
		side := "r"
		if req.Kind == dlockdriver.KindWrite {
			side = "w"
		} else {
			wait = ""
		}
		cmd = rwAcquireScript.Run(ctx, d.c, keys, req.Token, px, side, wait)
	default:
		return nil, fmt.Errorf("redis: unknown request kind %v", req.Kind)
	}
	v, err := cmd.Int64Slice()
	if err == nil && len(v) < 2 {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	if err != nil {
		return nil, fmt.Errorf("redis: acquiring %s %q: %w", req.Kind, keys[0], err)
	}
	switch v[0] {
	case kindGranted:
		return &dlockdriver.Grant{
			Handle: d.kindHandle(req.Kind, req.Name, req.Token),
			TTL:    time.Duration(px) * time.Millisecond,
			Fence:  uint64(v[1]),
		}, nil
	case kindMismatch:
		return nil, dlockdriver.LimitMismatch(req.Name, req.Limit, int(v[1]))
	}
	switch ms := v[1]; {
	case ms < 0:
		return nil, dlockdriver.Busy(0) // a key without expiry: unknown
	case ms == 0:
		return nil, dlockdriver.Busy(time.Microsecond)
	default:
		return nil, dlockdriver.Busy(time.Duration(ms) * time.Millisecond)
	}
}

func (d *driver) kindHandle(k dlockdriver.Kind, name string, token any) *kindHandle {
	h := &kindHandle{d: d, kind: k, token: token, channel: d.kindChannel(k, name)}
	switch k {
	case dlockdriver.KindPermit:
		h.keys = d.permitKeys(name)[:2] // the holders, the limit
	case dlockdriver.KindRead:
		h.keys = d.rwKeys(name)[:1] // the readers
	case dlockdriver.KindWrite:
		h.keys = d.rwKeys(name)[1:3] // the writer, the writers' waits
	}
	return h
}

// kindHandle is one held permit or side of a read/write lock.
type kindHandle struct {
	d       *driver
	kind    dlockdriver.Kind
	keys    []string // permit: holders, limit; read: readers; write: writer, waits
	channel string
	token   any
}

func (h *kindHandle) notHeld() error {
	return fmt.Errorf("%w: redis: %q holds no %s of this lease's token", dlock.ErrNotHeld, h.keys[0], h.kind)
}

func (h *kindHandle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	px := millis(ttl)
	var cmd *goredis.Cmd
	if h.kind == dlockdriver.KindWrite {
		cmd = refreshScript.Run(ctx, h.d.c, h.keys[:1], h.token, px)
	} else {
		cmd = membersRefreshScript.Run(ctx, h.d.c, h.keys, h.token, px)
	}
	n, err := cmd.Int64()
	if err != nil {
		return 0, fmt.Errorf("redis: refreshing %s %q: %w", h.kind, h.keys[0], err)
	}
	if n == 0 {
		return 0, h.notHeld()
	}
	if err := h.d.syncReplicas(ctx); err != nil {
		return 0, fmt.Errorf("redis: refreshing %s %q: %w", h.kind, h.keys[0], err)
	}
	return time.Duration(px) * time.Millisecond, nil
}

func (h *kindHandle) Release(ctx context.Context) error {
	n, err := h.d.releaseKind(ctx, h.kind, h.keys, h.channel, h.token, "")
	if err != nil {
		return err
	}
	if n == 0 {
		return h.notHeld()
	}
	return nil
}

func (h *kindHandle) Held(ctx context.Context) (bool, error) {
	if h.kind == dlockdriver.KindWrite {
		v, err := h.d.c.Get(ctx, h.keys[0]).Result()
		if errors.Is(err, goredis.Nil) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("redis: reading %q: %w", h.keys[0], err)
		}
		return v == h.token.(string), nil
	}
	n, err := membersRefreshScript.Run(ctx, h.d.c, h.keys, h.token, 0).Int64()
	if err != nil {
		return false, fmt.Errorf("redis: reading %q: %w", h.keys[0], err)
	}
	return n == 1, nil
}

// releaseKind runs the release script of kind with keys as a kindHandle
// has them: it removes token's hold, if any, and for a writer the wait
// (when not ""); it reports whether token held.
func (d *driver) releaseKind(ctx context.Context, k dlockdriver.Kind, keys []string, channel string, token any, wait string) (int64, error) {
	var cmd *goredis.Cmd
	if k == dlockdriver.KindWrite {
		cmd = rwReleaseScript.Run(ctx, d.c, keys, token, wait, channel)
	} else {
		cmd = membersReleaseScript.Run(ctx, d.c, keys, token, channel)
	}
	n, err := cmd.Int64()
	if err != nil {
		return 0, fmt.Errorf("redis: releasing %s %q: %w", k, keys[0], err)
	}
	return n, nil
}

// abandonKind removes what req.Token may hold of a permit or a side of a
// read/write lock, and a writer's wait (when not "").
func (d *driver) abandonKind(ctx context.Context, req dlockdriver.Request, wait string) error {
	h := d.kindHandle(req.Kind, req.Name, req.Token)
	_, err := d.releaseKind(ctx, req.Kind, h.keys, h.channel, req.Token, wait)
	return err
}

// acquireKind is Acquire for a permit or a side of a read/write lock:
// notified polling, with no queue on the server. Every attempt runs the
// kind's acquire script with the same token (an attempt whose reply was
// lost but which took a permit is renewed by the next, not doubled).
//
// After an attempt that found the object busy it watches the object's
// release channel (once: a confirmed subscription, then one more attempt,
// since a release may have come before it) and waits for a message on it, or
// for what blocked it to expire, whichever is first; without a watch it
// polls at least every unwatchedPoll. A writer registers its wait (a fresh
// one when req.Wait is empty) in every attempt that finds the lock busy, so
// that new readers stay out; the attempt that grants it removes the wait.
// When ctx ends without a grant it runs the kind's release script with the
// token (and the writer's wait), waiting for it up to leaveWait, so that
// nothing it took or registered is left behind.
func (q *queueDriver) acquireKind(ctx context.Context, req dlockdriver.Request) (g *dlockdriver.Grant, err error) {
	d := q.driver
	wait := req.Wait
	if req.Kind == dlockdriver.KindWrite && wait == "" {
		wait = newID() + newID()
	}
	channel := d.kindChannel(req.Kind, req.Name)
	life := max(req.TTL, minLifetime)
	c := make(chan struct{}, 1)
	var (
		x         *redishub.Watcher
		sentAny   bool
		retry     = backoff.Backoff{Min: errBackoffMin, Max: errBackoffMax}
		nextWatch time.Time
		lastErr   error
	)
	defer func() {
		if x != nil {
			x.Stop()
		}
		if err != nil && sentAny {
			q.leaveKind(ctx, req, wait)
		}
	}()
	done := func() error {
		return errors.Join(dlock.ErrNotAcquired, ctx.Err(), lastErr)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		sent := time.Now()
		sentAny = true
		g, err := d.tryKind(ctx, req, wait)
		if err == nil {
			g.Sent = sent
			return g, nil
		}
		if ctx.Err() != nil {
			return nil, done()
		}
		var busy *dlockdriver.BusyError
		var delay time.Duration
		switch {
		case errors.As(err, &busy):
			lastErr = nil
			retry.Reset()
			if x == nil && !time.Now().Before(nextWatch) {
				var werr error
				x, werr = d.hub.Watch(ctx, channel, "", func(string, bool) { redishub.Signal(c) })
				switch {
				case werr == nil:
					continue // a release may have come before the watch: look again
				case ctx.Err() != nil:
					return nil, done()
				case errors.Is(werr, dlock.ErrClosed):
					return nil, errors.Join(dlock.ErrNotAcquired, werr)
				}
				x, lastErr = nil, werr
				nextWatch = time.Now().Add(rewatchEvery)
			}
			delay = life / 3
			if req.Kind == dlockdriver.KindWrite {
				// Renew the wait before its deadline (what blocks it, plus
				// the TTL) even when what blocks it has no known expiry.
				delay = min(delay, req.TTL/2)
			}
			if busy.RetryAfter > 0 && busy.RetryAfter+time.Millisecond < delay {
				delay = busy.RetryAfter + time.Millisecond
			}
		case errors.Is(err, dlock.ErrInvalid):
			return nil, err // a limit mismatch
		default:
			lastErr = err
			delay = retry.Next()
		}
		if x == nil {
			delay = min(delay, unwatchedPoll)
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			return nil, done()
		case <-c:
		case <-timer.C:
		}
	}
}

// leaveKind runs the kind's release script for a wait that ends without a
// grant (see leave).
func (q *queueDriver) leaveKind(ctx context.Context, req dlockdriver.Request, wait string) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(req.TTL, leaveTimeout))
	done := make(chan struct{})
	q.bg.Add(1)
	go func() {
		defer q.bg.Done()
		defer close(done)
		defer cancel()
		_ = q.abandonKind(lctx, req, wait)
	}()
	t := time.NewTimer(min(req.TTL, leaveWait))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
