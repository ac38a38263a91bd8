package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/dlock/dlock"
	goredis "github.com/redis/go-redis/v9"
)

const (
	// readWake bounds each read on the pub/sub connection, so that the
	// receive loop can check for unanswered commands. It sends nothing.
	readWake = time.Second
	// maxBackoff bounds the delay between reconnection attempts.
	maxBackoff = time.Second
)

// pingIdle is how long a subscribed connection may stay silent before the
// receive loop sends a PING to learn whether it is still alive (a variable
// for tests).
var pingIdle = 10 * time.Second

// hub shares one pub/sub connection among all the waiters of a Locker. Each
// release channel is subscribed while at least one waiter watches it; a
// waiter's Watch returns once the server has confirmed that subscription.
//
// Two goroutines, started at the first Watch and stopped by close: the
// writer sends SUBSCRIBE and UNSUBSCRIBE for the channels whose wanted state
// changed, and the receive loop reads confirmations and messages.
//
// The connection lives in epochs. When it fails (a read or write error, or a
// SUBSCRIBE, UNSUBSCRIBE or PING unanswered for confirmTimeout; a connection
// silent for pingIdle is pinged) the epoch ends: its PubSub is closed and
// replaced by a fresh one, every watched channel is subscribed again, and
// every waiter is woken at once and again when its channel's new
// subscription is confirmed, since a release may have gone unheard in
// between. Watches still waiting for a confirmation fail, so that their
// callers fall back to polling until they can watch again. Counting commands
// and confirmations per channel and epoch keeps a subscribe, unsubscribe,
// subscribe sequence from looking confirmed before its last reply.
//
// go-redis reconnects and resubscribes a PubSub by itself; the hub does not
// rely on that, because it cannot tell which confirmations the new connection
// will bring. It starts each epoch on a PubSub of its own instead.
type hub struct {
	client         goredis.UniversalClient
	confirmTimeout time.Duration

	mu          sync.Mutex
	started     bool
	closed      bool
	ctx         context.Context // cancelled by close
	cancel      context.CancelFunc
	ps          *goredis.PubSub // this epoch's connection
	epoch       uint64
	broken      chan struct{} // closed when this epoch ends
	chans       map[string]*watched
	dirty       map[*watched]struct{} // wanted state may differ from what was sent
	outstanding int                   // commands sent this epoch and not yet answered
	waitingFrom time.Time             // since when an answer is awaited, when outstanding > 0
	subscribed  int                   // channels whose last command this epoch was SUBSCRIBE
	lastHeard   time.Time             // last reply this epoch

	kick   chan struct{} // 1-buffered: the writer has work
	active chan struct{} // 1-buffered: the receive loop has something to read
	wg     sync.WaitGroup
}

// watched is the state of one release channel.
type watched struct {
	name       string
	waiters    map[chan struct{}]struct{}
	subscribed bool          // the last command sent this epoch was SUBSCRIBE
	pending    int           // commands sent this epoch and not yet confirmed
	ready      chan struct{} // closed when subscribed and confirmed this epoch
	isReady    bool
	rewake     bool // wake the waiters when confirmed again after an epoch ended
}

func (h *hub) init(client goredis.UniversalClient, confirmTimeout time.Duration) {
	h.client = client
	h.confirmTimeout = confirmTimeout
	h.chans = map[string]*watched{}
	h.dirty = map[*watched]struct{}{}
	h.broken = make(chan struct{})
	h.kick = make(chan struct{}, 1)
	h.active = make(chan struct{}, 1)
	h.ctx, h.cancel = context.WithCancel(context.Background())
}

// watch registers a waiter on channel and returns once the server has
// confirmed the subscription, the connection failed (an error: the caller
// falls back to polling and may watch again), ctx ended or the hub closed.
func (h *hub) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, dlock.ErrClosed
	}
	if !h.started {
		h.started = true
		h.ps = h.client.Subscribe(h.ctx)
		h.wg.Add(2)
		go h.writeLoop()
		go h.receiveLoop()
	}
	w := h.chans[channel]
	if w == nil {
		w = &watched{name: channel, waiters: map[chan struct{}]struct{}{}, ready: make(chan struct{})}
		h.chans[channel] = w
	}
	c := make(chan struct{}, 1)
	w.waiters[c] = struct{}{}
	if len(w.waiters) == 1 {
		h.markDirty(w)
	}
	ready, broken := w.ready, h.broken
	h.mu.Unlock()

	var once sync.Once
	stop := func() { once.Do(func() { h.unwatch(w, c) }) }
	select {
	case <-ready:
		return c, stop, nil
	case <-broken:
		stop()
		return nil, nil, fmt.Errorf("redis: subscribing to %q: the pub/sub connection failed", channel)
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	case <-h.ctx.Done():
		stop()
		return nil, nil, dlock.ErrClosed
	}
}

func (h *hub) unwatch(w *watched, c chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(w.waiters, c)
	if len(w.waiters) == 0 && !h.closed {
		h.markDirty(w)
	}
}

// markDirty queues w for the writer; h.mu held.
func (h *hub) markDirty(w *watched) {
	h.dirty[w] = struct{}{}
	signal(h.kick)
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// writeLoop sends the commands that bring the server's subscriptions in line
// with the waiters.
func (h *hub) writeLoop() {
	defer h.wg.Done()
	backoff := time.Duration(0)
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.kick:
		}
		if err := h.flush(); err != nil {
			backoff = min(max(2*backoff, 10*time.Millisecond), maxBackoff)
			if !sleep(h.ctx, backoff) {
				return
			}
			signal(h.kick) // the new epoch has everything to resubscribe
		} else {
			backoff = 0
		}
	}
}

// flush sends one SUBSCRIBE and one UNSUBSCRIBE covering every dirty channel.
func (h *hub) flush() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	var subs, unsubs []string
	for w := range h.dirty {
		want := len(w.waiters) > 0
		switch {
		case want && !w.subscribed:
			subs = append(subs, w.name)
			w.subscribed = true
			w.pending++
			h.subscribed++
		case !want && w.subscribed:
			unsubs = append(unsubs, w.name)
			w.subscribed = false
			w.pending++
			h.subscribed--
			w.unready()
		}
		h.forgetIfIdle(w)
	}
	clear(h.dirty)
	n := len(subs) + len(unsubs)
	if n == 0 {
		h.mu.Unlock()
		return nil
	}
	h.expect(n)
	ps, epoch := h.ps, h.epoch
	h.mu.Unlock()
	signal(h.active)

	ctx, cancel := context.WithTimeout(h.ctx, h.confirmTimeout)
	defer cancel()
	var err error
	if len(subs) > 0 {
		err = ps.Subscribe(ctx, subs...)
	}
	if len(unsubs) > 0 && err == nil {
		err = ps.Unsubscribe(ctx, unsubs...)
	}
	if err != nil && h.endEpoch(epoch) {
		return err // back off: the next epoch may fail alike
	}
	return nil
}

// expect records n more commands awaiting an answer; h.mu held.
func (h *hub) expect(n int) {
	if h.outstanding == 0 {
		h.waitingFrom = time.Now()
	}
	h.outstanding += n
}

// unready makes w wait for a new confirmation; h.mu held.
func (w *watched) unready() {
	if w.isReady {
		w.isReady = false
		w.ready = make(chan struct{})
	}
}

// forgetIfIdle drops w when nothing refers to it any more; h.mu held.
func (h *hub) forgetIfIdle(w *watched) {
	if len(w.waiters) == 0 && !w.subscribed && w.pending == 0 {
		if h.chans[w.name] == w {
			delete(h.chans, w.name)
		}
		delete(h.dirty, w)
	}
}

// receiveLoop reads the pub/sub connection: confirmations, release messages
// and pongs. It parks while there is nothing to read.
func (h *hub) receiveLoop() {
	defer h.wg.Done()
	backoff := time.Duration(0)
	for {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return
		}
		ps, epoch := h.ps, h.epoch
		idle := h.outstanding == 0 && h.subscribed == 0
		h.mu.Unlock()
		if idle {
			select {
			case <-h.ctx.Done():
				return
			case <-h.active:
			}
			continue
		}
		msg, err := ps.ReceiveTimeout(h.ctx, readWake)
		if err == nil {
			backoff = 0
			h.received(epoch, msg)
			continue
		}
		if h.ctx.Err() != nil {
			return
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			h.check(ps, epoch)
			continue
		}
		if h.endEpoch(epoch) {
			backoff = min(max(2*backoff, 10*time.Millisecond), maxBackoff)
			if !sleep(h.ctx, backoff) {
				return
			}
		}
	}
}

// received applies one reply read in epoch.
func (h *hub) received(epoch uint64, msg any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if epoch != h.epoch || h.closed {
		return
	}
	now := time.Now()
	h.lastHeard = now
	switch m := msg.(type) {
	case *goredis.Message:
		if w := h.chans[m.Channel]; w != nil {
			w.wake()
		}
	case *goredis.Subscription:
		w := h.chans[m.Channel]
		if w == nil || w.pending == 0 {
			return // not ours
		}
		w.pending--
		h.answered(now)
		if w.pending == 0 && w.subscribed && !w.isReady {
			w.isReady = true
			close(w.ready)
			if w.rewake {
				w.rewake = false
				w.wake()
			}
		}
		h.forgetIfIdle(w)
	case *goredis.Pong:
		h.answered(now)
	}
}

// answered counts one answer; h.mu held.
func (h *hub) answered(now time.Time) {
	if h.outstanding > 0 {
		h.outstanding--
		h.waitingFrom = now
	}
}

// wake tells every waiter of w to try again; h.mu held.
func (w *watched) wake() {
	for c := range w.waiters {
		signal(c)
	}
}

// check runs when a read timed out: it ends the epoch if an answer is
// overdue, and pings a connection that has been silent for long.
func (h *hub) check(ps *goredis.PubSub, epoch uint64) {
	h.mu.Lock()
	if epoch != h.epoch || h.closed {
		h.mu.Unlock()
		return
	}
	now := time.Now()
	if h.outstanding > 0 {
		overdue := now.Sub(h.waitingFrom) > h.confirmTimeout
		h.mu.Unlock()
		if overdue {
			h.endEpoch(epoch)
		}
		return
	}
	if h.subscribed == 0 || now.Sub(h.lastHeard) < pingIdle {
		h.mu.Unlock()
		return
	}
	h.expect(1)
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(h.ctx, h.confirmTimeout)
	defer cancel()
	if err := ps.Ping(ctx); err != nil {
		h.endEpoch(epoch)
	}
}

// endEpoch replaces the connection of epoch, if it is still the current one,
// with a fresh PubSub, and wakes every waiter. It reports whether it did.
func (h *hub) endEpoch(epoch uint64) bool {
	h.mu.Lock()
	if epoch != h.epoch || h.closed {
		h.mu.Unlock()
		return false
	}
	old := h.ps
	h.ps = h.client.Subscribe(h.ctx)
	h.epoch++
	close(h.broken)
	h.broken = make(chan struct{})
	h.outstanding, h.subscribed = 0, 0
	for _, w := range h.chans {
		w.subscribed, w.pending = false, 0
		w.unready()
		if len(w.waiters) > 0 {
			w.rewake = true
			w.wake()
			h.markDirty(w)
		} else {
			h.forgetIfIdle(w)
		}
	}
	h.mu.Unlock()
	_ = old.Close()
	return true
}

// close stops both goroutines, waits for them and closes the connection.
func (h *hub) close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.cancel()
	ps := h.ps
	h.mu.Unlock()
	var err error
	if ps != nil {
		err = ps.Close()
	}
	h.wg.Wait()
	if err != nil {
		return fmt.Errorf("redis: closing the pub/sub connection: %w", err)
	}
	return nil
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
