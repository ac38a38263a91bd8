// Package redishub shares one Redis pub/sub connection among the waiters of
// a Locker: the redis driver runs one, the redlock driver one per node.
package redishub

// One file, over 600 lines: the hub is one state machine over one pub/sub
// connection (watch, subscribe, confirm, linger, reconnect by epochs), with
// its writer and receiver loops sharing its lock; the package is this file.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/backoff"
	goredis "github.com/redis/go-redis/v9"
)

const (
	// ReadWake bounds each read on the pub/sub connection, so that the
	// receive loop can check for unanswered commands. It sends nothing.
	ReadWake = time.Second
	// minBackoff and maxBackoff bound the delay between reconnection
	// attempts.
	minBackoff = 10 * time.Millisecond
	maxBackoff = time.Second
)

// probeEvery is how often a hub with a probe channel (SetProbe) checks,
// while any waiter watches, that its subscriptions are on the server the
// client's commands reach; maxProbeEvery bounds its back-off after a probe
// ended an epoch (a setup where the check can never pass does not churn).
const (
	probeEvery    = time.Second
	maxProbeEvery = time.Minute
)

// defaultPingIdle is how long a subscribed connection may stay silent before
// the receive loop sends a PING to learn whether it is still alive.
const defaultPingIdle = 10 * time.Second

const (
	// defaultLinger is how long a channel stays subscribed after its last
	// waiter left, so that a name locked in a loop does not pay a SUBSCRIBE
	// round trip (and an UNSUBSCRIBE) for every wait.
	defaultLinger = 2 * time.Second
	// maxLingering bounds the channels kept subscribed without waiters; past
	// it, a channel whose last waiter leaves is unsubscribed at once.
	maxLingering = 1024
)

// Hub shares one pub/sub connection among all the waiters of a Locker (of
// one node). Each release channel is subscribed while at least one waiter
// watches it, and for Linger after the last one left (at most maxLingering
// channels linger); a waiter's Watch returns once the server has confirmed
// that subscription.
//
// Every message on a channel is passed to every waiter of that channel,
// unless Route claims it for one waiter (see New).
//
// Two goroutines, started at the first Watch and stopped by close: the
// writer sends SUBSCRIBE and UNSUBSCRIBE for the channels whose wanted state
// changed, and the receive loop reads confirmations and messages.
//
// The connection lives in epochs. When it fails (a read or write error, or a
// SUBSCRIBE, UNSUBSCRIBE or PING unanswered for confirmTimeout; a connection
// silent for defaultPingIdle is pinged) the epoch ends: its PubSub is closed and
// replaced by a fresh one, every watched channel is subscribed again, and
// every waiter is woken at once and again when its channel's new
// subscription is confirmed, since a release may have gone unheard in
// between. Watches still waiting for a confirmation fail, so that their
// callers fall back to polling until they can watch again. Counting commands
// and confirmations per channel and epoch keeps a subscribe, unsubscribe,
// subscribe sequence from looking confirmed before its last reply.
//
// A connection can also be alive and subscribed on the wrong server: after a
// Sentinel failover a go-redis failover client sends its commands (and so
// the scripts' PUBLISH) to the promoted master at once, while its pub/sub
// connection stays on the old master, which hears none of them until
// Sentinel demotes it (some 10s later). A hub given a probe channel
// (SetProbe) checks for that; see there.
//
// go-redis reconnects and resubscribes a PubSub by itself; the hub does not
// rely on that, because it cannot tell which confirmations the new connection
// will bring. It starts each epoch on a PubSub of its own instead.
type Hub struct {
	client         goredis.UniversalClient
	name           string // the driver, in errors
	route          func(payload string) (key string, ok bool)
	confirmTimeout time.Duration
	linger         time.Duration // zero: unsubscribe as soon as the last waiter leaves
	pingIdle       time.Duration // silence after which the connection is pinged
	probe          string        // SetProbe's channel; "": no probe

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
	lingering   int                   // channels with lingerUntil set
	lingerTimer *time.Timer           // wakes the writer to drop lingering channels
	waiters     int                   // watches but probeX
	probeX      *Watcher              // the hub's own watch of probe, while waiters > 0
	probeGen    uint64                // counts UNSUBSCRIBEs of probe
	probeEvery  time.Duration         // the probe's period, backed off after a failure
	nextProbe   time.Time             // when the probe is due

	kick   chan struct{} // 1-buffered: the writer has work
	active chan struct{} // 1-buffered: the receive loop has something to read
	wg     sync.WaitGroup
}

// watched is the state of one release channel.
type watched struct {
	name        string
	waiters     map[*Watcher]struct{}
	keys        map[string]*Watcher // the waiters that watch with a key
	lingerUntil time.Time           // not zero: subscribed without waiters until then
	subscribed  bool                // the last command sent this epoch was SUBSCRIBE
	pending     int                 // commands sent this epoch and not yet confirmed
	ready       chan struct{}       // closed when subscribed and confirmed this epoch
	isReady     bool
	rewake      bool // wake the waiters when confirmed again after an epoch ended
}

// Watcher is one waiter's registration on a channel.
type Watcher struct {
	h   *Hub
	w   *watched
	key string // "" for a watch that Route never picks
	// notify is told to look again: with the message's payload and true for
	// a message published on the channel, with "" and false when the
	// connection failed or was subscribed again (a release may have gone
	// unheard). It is called with the hub's lock held and must not block.
	notify   func(payload string, message bool)
	listener bool // made by Listen: not counted in Hub.waiters
	once     sync.Once
}

// Stop ends the watch; it may be called more than once.
func (x *Watcher) Stop() { x.once.Do(func() { x.h.unwatch(x) }) }

// New returns a Hub on client's pub/sub connections (made at the first
// Watch). name prefixes its errors ("redis", "redlock"). route, when not
// nil, picks the messages meant for one waiter: for a payload it returns the
// key of the waiter it is for (see Watch), and the message reaches that
// waiter only, or none if no waiter watches the channel with that key.
// Confirmations (of SUBSCRIBE, UNSUBSCRIBE, PING) may take the client's read
// timeout (3s when unset) before the connection is given up.
func New(client goredis.UniversalClient, name string, route func(payload string) (key string, ok bool)) *Hub {
	h := &Hub{client: client, name: name, route: route}
	h.confirmTimeout = confirmTimeout(client)
	h.linger = defaultLinger
	h.pingIdle = defaultPingIdle
	h.probeEvery = probeEvery
	h.chans = map[string]*watched{}
	h.dirty = map[*watched]struct{}{}
	h.broken = make(chan struct{})
	h.kick = make(chan struct{}, 1)
	h.active = make(chan struct{}, 1)
	h.ctx, h.cancel = context.WithCancel(context.Background())
	return h
}

// SetLinger sets how long a channel stays subscribed after its last waiter
// left (default 2s; zero: unsubscribe at once). Call it before the first
// Watch.
func (h *Hub) SetLinger(d time.Duration) { h.linger = d }

// SetProbe makes channel, a name no other hub subscribes to, the hub's
// probe: while any waiter watches, the hub keeps it subscribed too and, every
// second, asks the server the client's commands reach how many subscribers
// it has (PUBSUB NUMSUB, one round trip). None means the pub/sub connection
// is on another server than the one where the scripts PUBLISH (a failover
// client after a failover, a DNS name moved to a new primary): the epoch
// ends, the new connection is made to where the commands go, and every
// waiter looks again at once and again once subscribed there. It applies to
// a *goredis.Client only (a Redis Cluster delivers PUBLISH to every node,
// and NUMSUB counts one node's subscribers). Call it before the first Watch.
func (h *Hub) SetProbe(channel string) {
	if _, ok := h.client.(*goredis.Client); ok {
		h.probe = channel
	}
}

// confirmTimeout is how long the pub/sub connection may leave a SUBSCRIBE or
// PING unanswered: the client's read timeout (3s by default).
func confirmTimeout(c goredis.UniversalClient) time.Duration {
	var rt time.Duration
	switch c := c.(type) {
	case *goredis.Client:
		rt = c.Options().ReadTimeout
	case *goredis.ClusterClient:
		rt = c.Options().ReadTimeout
	}
	if rt <= 0 {
		rt = 3 * time.Second
	}
	return rt
}

// Ready reports whether channel is subscribed and confirmed now (a watch of
// it would return at once).
func (h *Hub) Ready(channel string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.chans[channel]
	return w != nil && w.isReady
}

// Watch registers a waiter on channel, told through notify (see Watcher),
// and returns once the server has confirmed the subscription, the
// connection failed (an error: the caller falls back to polling and may
// watch again), ctx ended or the hub closed (dlock.ErrClosed). Messages that
// Route gives key reach this waiter only (the last one to watch with it); ""
// takes none of them. Stop ends the watch.
func (h *Hub) Watch(ctx context.Context, channel, key string, notify func(payload string, message bool)) (*Watcher, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, dlock.ErrClosed
	}
	if _, ok := h.client.(*goredis.Ring); ok {
		// Ring.Subscribe panics without a channel, and a Ring's channels
		// live on the shard their name hashes to, not where the lock's
		// script PUBLISHes. The drivers refuse a Ring; this keeps a panic
		// out of the hub's goroutines should one get here anyway.
		h.mu.Unlock()
		return nil, fmt.Errorf("%s: pub/sub on a *redis.Ring is not supported", h.name)
	}
	h.startLocked()
	if h.probe != "" && h.waiters == 0 {
		h.probeX = h.add(h.probe, "", func(string, bool) {})
	}
	h.waiters++
	x := h.add(channel, key, notify)
	ready, broken := x.w.ready, h.broken
	h.mu.Unlock()

	select {
	case <-ready:
		return x, nil
	case <-broken:
		x.Stop()
		return nil, fmt.Errorf("%s: subscribing to %q: the pub/sub connection failed", h.name, channel)
	case <-ctx.Done():
		x.Stop()
		return nil, ctx.Err()
	case <-h.ctx.Done():
		x.Stop()
		return nil, dlock.ErrClosed
	}
}

// startLocked starts the hub's connection and loops on first use; h.mu
// held.
func (h *Hub) startLocked() {
	if !h.started {
		h.started = true
		h.ps = h.client.Subscribe(h.ctx)
		h.wg.Add(2)
		go h.writeLoop()
		go h.receiveLoop()
	}
}

// Listen registers a listener on channel, told through notify like a
// waiter (see Watcher), and returns at once: the subscription is made in
// the background, and a message published before it is confirmed is not
// heard. It is for what a caller learns sooner this way but would learn
// anyway (a holder told of a steal, which its next refresh finds too), so
// a listener does not start the probe (SetProbe) that waiters do. Messages
// that Route gives key reach this listener only. Stop ends it. It returns
// dlock.ErrClosed once the hub is closed, and an error for a
// *redis.Ring.
func (h *Hub) Listen(channel, key string, notify func(payload string, message bool)) (*Watcher, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, dlock.ErrClosed
	}
	if _, ok := h.client.(*goredis.Ring); ok {
		return nil, fmt.Errorf("%s: pub/sub on a *redis.Ring is not supported", h.name)
	}
	h.startLocked()
	x := h.add(channel, key, notify)
	x.listener = true
	return x, nil
}

// add registers a watch of channel; h.mu held.
func (h *Hub) add(channel, key string, notify func(payload string, message bool)) *Watcher {
	w := h.chans[channel]
	if w == nil {
		w = &watched{name: channel, waiters: map[*Watcher]struct{}{}, keys: map[string]*Watcher{}, ready: make(chan struct{})}
		h.chans[channel] = w
	}
	x := &Watcher{h: h, w: w, key: key, notify: notify}
	w.waiters[x] = struct{}{}
	if key != "" {
		w.keys[key] = x
	}
	h.stopLinger(w)
	if len(w.waiters) == 1 {
		h.markDirty(w)
	}
	return x
}

func (h *Hub) unwatch(x *Watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.remove(x)
	if x.listener {
		return
	}
	h.waiters--
	if h.waiters == 0 && h.probeX != nil {
		h.remove(h.probeX)
		h.probeX = nil
	}
}

// remove ends watch x; h.mu held.
func (h *Hub) remove(x *Watcher) {
	w := x.w
	delete(w.waiters, x)
	if x.key != "" && w.keys[x.key] == x {
		delete(w.keys, x.key)
	}
	if len(w.waiters) > 0 || h.closed {
		return
	}
	// Linger only on a confirmed subscription: one still being set up (or
	// torn down) is left to the writer, as is everything past the cap.
	if h.linger > 0 && w.isReady && h.lingering < maxLingering {
		w.lingerUntil = time.Now().Add(h.linger)
		h.lingering++
		if h.lingerTimer == nil {
			h.lingerTimer = time.AfterFunc(h.linger, func() { Signal(h.kick) })
		} else if h.lingering == 1 {
			h.lingerTimer.Reset(h.linger)
		}
		return
	}
	h.markDirty(w)
}

// stopLinger ends w's lingering, if it lingers; h.mu held.
func (h *Hub) stopLinger(w *watched) {
	if !w.lingerUntil.IsZero() {
		w.lingerUntil = time.Time{}
		h.lingering--
	}
}

// expireLingering marks for unsubscription the channels whose linger has
// passed and rearms the timer for the others; h.mu held.
func (h *Hub) expireLingering(now time.Time) {
	if h.lingering == 0 {
		return
	}
	var next time.Time
	for _, w := range h.chans {
		if w.lingerUntil.IsZero() {
			continue
		}
		if !w.lingerUntil.After(now) {
			h.stopLinger(w)
			h.markDirty(w)
		} else if next.IsZero() || w.lingerUntil.Before(next) {
			next = w.lingerUntil
		}
	}
	if !next.IsZero() && h.lingerTimer != nil {
		h.lingerTimer.Reset(next.Sub(now))
	}
}

// markDirty queues w for the writer; h.mu held.
func (h *Hub) markDirty(w *watched) {
	h.dirty[w] = struct{}{}
	Signal(h.kick)
}

// Signal sends on a 1-buffered channel without blocking.
func Signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// writeLoop sends the commands that bring the server's subscriptions in line
// with the waiters.
func (h *Hub) writeLoop() {
	defer h.wg.Done()
	retry := backoff.Backoff{Min: minBackoff, Max: maxBackoff}
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.kick:
		}
		if err := h.flush(); err != nil {
			if !retry.Sleep(h.ctx) {
				return
			}
			Signal(h.kick) // the new epoch has everything to resubscribe
		} else {
			retry.Reset()
		}
	}
}

// flush sends one SUBSCRIBE and one UNSUBSCRIBE covering every dirty channel.
func (h *Hub) flush() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.expireLingering(time.Now())
	var subs, unsubs []string
	for w := range h.dirty {
		want := len(w.waiters) > 0 || !w.lingerUntil.IsZero()
		switch {
		case want && !w.subscribed:
			subs = append(subs, w.name)
			w.subscribed = true
			w.pending++
			h.subscribed++
		case !want && w.subscribed:
			unsubs = append(unsubs, w.name)
			if w.name == h.probe {
				h.probeGen++
			}
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
	Signal(h.active)

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
func (h *Hub) expect(n int) {
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
func (h *Hub) forgetIfIdle(w *watched) {
	if len(w.waiters) == 0 && w.lingerUntil.IsZero() && !w.subscribed && w.pending == 0 {
		if h.chans[w.name] == w {
			delete(h.chans, w.name)
		}
		delete(h.dirty, w)
	}
}

// receiveLoop reads the pub/sub connection: confirmations, release messages
// and pongs. It parks while there is nothing to read.
func (h *Hub) receiveLoop() {
	defer h.wg.Done()
	retry := backoff.Backoff{Min: minBackoff, Max: maxBackoff}
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
		wake := ReadWake
		if h.probe != "" {
			next, ended := h.runProbe(epoch)
			if ended {
				continue
			}
			wake = min(wake, next)
		}
		msg, err := ps.ReceiveTimeout(h.ctx, wake)
		if err == nil {
			retry.Reset()
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
			if !retry.Sleep(h.ctx) {
				return
			}
		}
	}
}

// received applies one reply read in epoch.
func (h *Hub) received(epoch uint64, msg any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if epoch != h.epoch || h.closed {
		return
	}
	now := time.Now()
	h.lastHeard = now
	switch m := msg.(type) {
	case *goredis.Message:
		w := h.chans[m.Channel]
		if w == nil {
			return
		}
		if h.route != nil {
			if key, ok := h.route(m.Payload); ok {
				if x := w.keys[key]; x != nil {
					x.notify(m.Payload, true)
				}
				return
			}
		}
		w.wake(m.Payload, true)
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
				w.wake("", false)
			}
		}
		h.forgetIfIdle(w)
	case *goredis.Pong:
		h.answered(now)
	}
}

// answered counts one answer; h.mu held.
func (h *Hub) answered(now time.Time) {
	if h.outstanding > 0 {
		h.outstanding--
		h.waitingFrom = now
	}
}

// wake tells every waiter of w to try again; h.mu held.
func (w *watched) wake(payload string, message bool) {
	for x := range w.waiters {
		x.notify(payload, message)
	}
}

// runProbe runs the probe (see SetProbe) if it is due in epoch, ending the
// epoch if it fails (ended), and returns how long until it is due again
// (ReadWake when it cannot run now).
func (h *Hub) runProbe(epoch uint64) (next time.Duration, ended bool) {
	h.mu.Lock()
	w := h.chans[h.probe]
	now := time.Now()
	if h.closed || epoch != h.epoch || h.probeX == nil || w == nil || !w.isReady {
		h.mu.Unlock()
		return ReadWake, false
	}
	if wait := h.nextProbe.Sub(now); wait > 0 {
		h.mu.Unlock()
		return wait, false
	}
	gen := h.probeGen
	h.mu.Unlock()

	ctx, cancel := context.WithTimeout(h.ctx, h.confirmTimeout)
	n, err := h.client.PubSubNumSub(ctx, h.probe).Result()
	cancel()

	h.mu.Lock()
	stale := h.closed || epoch != h.epoch || gen != h.probeGen
	failed := err == nil && !stale && n[h.probe] == 0
	switch {
	case failed:
		h.probeEvery = min(2*h.probeEvery, maxProbeEvery)
	case err == nil && !stale:
		h.probeEvery = probeEvery
	}
	// A probe that could not tell (an error, or the connection or the
	// probe's subscription changed meanwhile) is tried again at the period.
	h.nextProbe = time.Now().Add(h.probeEvery)
	every := h.probeEvery
	h.mu.Unlock()
	if failed && h.endEpoch(epoch) {
		return every, true
	}
	return every, false
}

// check runs when a read timed out: it ends the epoch if an answer is
// overdue, and pings a connection that has been silent for long.
func (h *Hub) check(ps *goredis.PubSub, epoch uint64) {
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
	if h.subscribed == 0 || now.Sub(h.lastHeard) < h.pingIdle {
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
func (h *Hub) endEpoch(epoch uint64) bool {
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
		h.stopLinger(w)
		if len(w.waiters) > 0 {
			w.rewake = true
			w.wake("", false)
			h.markDirty(w)
		} else {
			h.forgetIfIdle(w)
		}
	}
	h.mu.Unlock()
	_ = old.Close()
	return true
}

// Close stops both goroutines, waits for them and closes the connection.
func (h *Hub) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.cancel()
	if h.lingerTimer != nil {
		h.lingerTimer.Stop()
	}
	ps := h.ps
	h.mu.Unlock()
	var err error
	if ps != nil {
		err = ps.Close()
	}
	h.wg.Wait()
	if err != nil {
		return fmt.Errorf("%s: closing the pub/sub connection: %w", h.name, err)
	}
	return nil
}

// globEscape escapes the glob characters of a SCAN MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Stats is a snapshot of a Hub's state, for tests of its mechanics.
type Stats struct {
	Channels    int       // channels with state (watched or lingering)
	Lingering   int       // channels kept subscribed without waiters
	Outstanding int       // commands sent this epoch and not yet answered
	Epoch       uint64    // connections started after the first
	LastHeard   time.Time // last reply this epoch
}

// Stats returns a snapshot of h's state.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Stats{Channels: len(h.chans), Lingering: h.lingering, Outstanding: h.outstanding, Epoch: h.epoch, LastHeard: h.lastHeard}
}

// SetPingIdle sets how long a subscribed connection may stay silent before it
// is pinged (default 10s), for tests; call it before the first Watch.
func (h *Hub) SetPingIdle(d time.Duration) { h.pingIdle = d }
