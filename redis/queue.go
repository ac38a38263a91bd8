package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
	goredis "github.com/redis/go-redis/v9"
)

const (
	// minLifetime is the shortest life of a queue entry: a waiter's entry
	// lives max(TTL, minLifetime) after its last renewal, and the waiter
	// renews it every third of that.
	minLifetime = time.Second
	// leaveTimeout bounds the release script a cancelled waiter runs to
	// leave the queue (and pass on a lock handed to it meanwhile); the TTL
	// bounds it too. Acquire waits for it up to leaveWait (so that on a
	// healthy server the entry is gone when Acquire returns, and on a dead
	// path Acquire still returns soon after its ctx); the rest runs in the
	// background, and Close waits for it.
	leaveTimeout = 2 * time.Second
	leaveWait    = 250 * time.Millisecond
	// unwatchedPoll is the longest a waiter without a confirmed subscription
	// (the pub/sub connection failed, or the user may not subscribe) waits
	// between runs of the acquire script: a lock handed to it is found there.
	unwatchedPoll = 200 * time.Millisecond
	// rewatchEvery is how often such a waiter tries to subscribe again.
	rewatchEvery = time.Second
	// errBackoffMin and errBackoffMax bound the delay before a waiter runs
	// the acquire script again after a backend error.
	errBackoffMin = 10 * time.Millisecond
	errBackoffMax = time.Second
)

// queueDriver is the driver in the default layout: it implements
// dlockdriver.Waiter with the server-side FIFO queue. The compat layout uses the
// bare *driver, so that the Locker's own (notified) polling loop waits there.
type queueDriver struct{ *driver }

// reply kinds of acquire.lua in the default layout.
const (
	replyBusy    = 0
	replyGranted = 1 // by this call
	replyHeld    = 2 // handed to the caller earlier
)

// reply is acquire.lua's answer in the default layout.
type reply struct {
	kind  int64
	fence uint64 // granted or held: the grant's fence; busy: the counter now
	busy  int64  // busy: the compat-style busy code for busy()
	pttl  int64  // busy: the holder's remaining ms, -1 when it has no expiry
	px    int64  // the TTL asked for, in ms
}

// acquire runs acquire.lua in the default layout; wait (0: TryAcquire) is
// how long the caller's queue entry lives; meta is the caller's metadata.
func (d *driver) acquire(ctx context.Context, keys []string, boxed []any, token any, ttl, wait time.Duration, meta string) (reply, error) {
	px := millis(ttl)
	r := reply{px: px}
	if boxed == nil {
		boxed = boxKeys(keys)
	}
	var cmd *goredis.Cmd
	switch {
	case meta != "" && wait > 0:
		cmd = acquireScript.run(ctx, d.c, boxed, token, px, millis(wait), d.grants, meta)
	case meta != "":
		cmd = acquireScript.run(ctx, d.c, boxed, token, px, 0, "", meta)
	case wait > 0:
		cmd = acquireScript.run(ctx, d.c, boxed, token, px, millis(wait), d.grants)
	default:
		cmd = acquireScript.run(ctx, d.c, boxed, token, px, 0)
	}
	if f, ok := cmd.Val().(int64); ok && cmd.Err() == nil {
		// Granted by this call, the reply the fence alone.
		if f <= 0 {
			return r, fmt.Errorf("redis: acquiring %q: unexpected reply %d", keys[0], f)
		}
		r.kind, r.fence = replyGranted, uint64(f)
		return r, nil
	}
	v, err := cmd.Int64Slice()
	if err == nil && (len(v) < 2 || (v[0] == replyBusy && len(v) < 3)) {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	if err != nil {
		return r, fmt.Errorf("redis: acquiring %q: %w", keys[0], err)
	}
	r.kind = v[0]
	if r.kind != replyBusy {
		r.fence = uint64(v[1])
		return r, nil
	}
	r.pttl, r.fence = v[1], uint64(v[2])
	// The compat reply's encoding, which busy() decodes.
	if r.pttl < 0 {
		r.busy = 0
	} else {
		r.busy = -1 - r.pttl
	}
	return r, nil
}

// Acquire waits in the server-side queue of req.Name until the lock is
// handed to req.Token or ctx ends.
//
// It watches the Locker's grant channel and the name's release channel
// first (confirmed subscriptions, so that no grant message can be missed;
// channels that linger subscribed from an earlier wait cost nothing, and
// when one is not subscribed yet it first makes one attempt that does not
// enqueue, so that a free lock costs one round trip), then runs acquire.lua,
// which grants, or enqueues the token with an entry that lives lifetime =
// max(TTL, 1s) and names the grant channel. It then waits for:
//
//   - a grant message to its token, on the grant channel: the lock is held
//     already (the release script set it to the token), with the fence from
//     the message;
//   - any other message on the channel (a release that found only dead
//     entries queued, or the pub/sub connection lost): it runs acquire.lua
//     again;
//   - the holder's remaining TTL, or lifetime/3, whichever is sooner: it runs
//     acquire.lua again, which renews the entry and takes over from a holder
//     that expired without releasing (handing the lock to the first live
//     waiter);
//   - ctx: it runs release.lua with the token, which removes its entry and,
//     should the lock have been handed to it meanwhile, passes it on.
//
// A grant's Sent is when the last request that found the lock not yet
// handed to the token was sent (see acquire.lua's {2, fence} reply): the
// handoff came after the server processed it, so the lock lives at least
// until then plus the TTL. A grant message is taken only if its fence is
// above the counter that request saw, so a message from an older grant
// (delayed past that grant's expiry) is not mistaken for a new one.
func (q *queueDriver) Acquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	g, err := q.acquireWait(ctx, req)
	return q.replicated(ctx, req.Name, g, err)
}

func (q *queueDriver) acquireWait(ctx context.Context, req dlockdriver.Request) (g *dlockdriver.Grant, err error) {
	if req.Kind != dlockdriver.KindLock {
		return q.acquireKind(ctx, req)
	}
	d := q.driver
	keys := d.keys(req.Name)
	channel := keys[0] + ":released"
	token := any(req.Token)
	life := max(req.TTL, minLifetime)
	meta := req.Metadata != ""

	var (
		x         *grantWatch
		sentAny   bool
		floor     time.Time // lower bound on when a handoff to us happened
		known     uint64    // the counter seen by the last busy reply
		retry     = backoff.Backoff{Min: errBackoffMin, Max: errBackoffMax}
		nextWatch time.Time
		lastErr   error
	)
	defer func() {
		if x != nil {
			x.Stop()
		}
		if err != nil && sentAny {
			q.leave(ctx, keys, token, req.TTL, meta)
		}
	}()
	run := func(wait time.Duration) (reply, time.Time, error) {
		sent := time.Now()
		if floor.IsZero() {
			floor = sent
		}
		sentAny = true
		r, err := d.acquire(ctx, keys, nil, token, req.TTL, wait, req.Metadata)
		if err == nil && r.kind == replyBusy {
			floor, known = sent, r.fence
		}
		return r, sent, err
	}
	done := func() error {
		return errors.Join(dlock.ErrNotAcquired, ctx.Err(), lastErr)
	}

	if !d.hub.Ready(channel) || !d.hub.Ready(d.grants) {
		r, sent, err := run(0)
		if err == nil && r.kind != replyBusy {
			return d.waitGrant(keys, token, r, sent, floor, meta), nil
		}
		if ctx.Err() != nil {
			return nil, done()
		}
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if x == nil && !time.Now().Before(nextWatch) {
			var werr error
			x, werr = d.watchGrants(ctx, channel, req.Token)
			if werr != nil {
				if ctx.Err() != nil {
					return nil, done()
				}
				if errors.Is(werr, dlock.ErrClosed) {
					return nil, errors.Join(dlock.ErrNotAcquired, werr)
				}
				lastErr = werr
				nextWatch = time.Now().Add(rewatchEvery)
			}
		}
		var c <-chan struct{}
		if x != nil {
			c = x.c
		}

		r, sent, err := run(life)
		var delay time.Duration
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return nil, done()
			}
			lastErr = err
			delay = retry.Next()
		case r.kind != replyBusy:
			return d.waitGrant(keys, token, r, sent, floor, meta), nil
		default:
			lastErr = nil
			retry.Reset()
			delay = life / 3
			if r.pttl >= 0 && time.Duration(r.pttl)*time.Millisecond+time.Millisecond < delay {
				delay = time.Duration(r.pttl)*time.Millisecond + time.Millisecond
			}
		}
		if x == nil {
			delay = min(delay, unwatchedPoll)
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			return nil, done()
		case <-c:
			// Our grant, or else anything (a release past dead entries, a
			// lost connection, a stale grant): look again.
			if f := x.fence.Load(); f > known {
				return withSent(d.grant(keys, nil, token, millis(req.TTL), f, meta), floor), nil
			}
		case <-timer.C:
		}
	}
}

// waitGrant is the grant of a wait that acquire.lua granted (sent: this
// call's send time) or found handed over already (floor).
func (d *driver) waitGrant(keys []string, token any, r reply, sent, floor time.Time, meta bool) *dlockdriver.Grant {
	g := d.grant(keys, nil, token, r.px, r.fence, meta)
	g.Sent = sent
	if r.kind == replyHeld {
		g.Sent = floor
	}
	return g
}

func withSent(g *dlockdriver.Grant, sent time.Time) *dlockdriver.Grant {
	g.Sent = sent
	return g
}

// leave runs release.lua for a wait that ends without a grant: it removes the
// token's queue entry and passes on a lock handed to it meanwhile. It runs
// after ctx ended, so on a context of its own, bounded by the TTL and
// leaveTimeout, and is waited for up to leaveWait; if it fails, the entry
// expires at its deadline and a lock handed to it at its TTL.
func (q *queueDriver) leave(ctx context.Context, keys []string, token any, ttl time.Duration, meta bool) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(ttl, leaveTimeout))
	done := make(chan struct{})
	q.bg.Add(1)
	go func() {
		defer q.bg.Done()
		defer close(done)
		defer cancel()
		_ = q.release(lctx, keys, nil, token, meta).Err()
	}()
	t := time.NewTimer(min(ttl, leaveWait))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
