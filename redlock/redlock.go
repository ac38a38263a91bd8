// One file, over 600 lines: the driver's shape across all nodes — options,
// New, the fan-out every operation uses, the shared release watch, and the
// handle's refresh and release — which acquire.go (the acquisition's
// quorum logic) builds on.

package redlock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
	"github.com/dlock/dlock/internal/redishub"
	goredis "github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire.lua
	acquireLua    string
	acquireScript = goredis.NewScript(acquireLua)

	//go:embed steal.lua
	stealLua    string
	stealScript = goredis.NewScript(stealLua)

	//go:embed fence.lua
	fenceLua    string
	fenceScript = goredis.NewScript(fenceLua)

	//go:embed refresh.lua
	refreshLua    string
	refreshScript = goredis.NewScript(refreshLua)

	//go:embed release.lua
	releaseLua    string
	releaseScript = goredis.NewScript(releaseLua)
)

const (
	// DefaultKeyPrefix is the key prefix of the default layout.
	DefaultKeyPrefix = "dlock:"
	// MinTTL is the shortest TTL the driver accepts: one that a majority
	// round can still be granted within on a loaded machine. A round is a
	// request per node, each on its own goroutine, and must end within the
	// TTL minus the drift margin (TTL/100 + 2ms). On 5 local nodes with a
	// 2-core machine at a load average of ~25, a round took 3ms at the
	// median and 39ms at the 99th percentile; with two busy loops more
	// (load ~30), 23ms and 96ms at the 90th. The 10ms this once was (redis'
	// single-node MinTTL) then failed most attempts.
	MinTTL = 100 * time.Millisecond
	// MaxDefaultNodeTimeout caps the default per-node timeout (TTL/5).
	MaxDefaultNodeTimeout = 500 * time.Millisecond
)

// ErrNoQuorum is what an operation fails with when too few nodes answered
// for a majority to decide, for example because a majority of the nodes is
// down or unreachable. It does not match dlock.ErrNotAcquired: the lock may
// well be free. Acquire keeps trying (with backoff) until its ctx ends.
var ErrNoQuorum = errors.New("redlock: no quorum")

// Options configure a Locker. A nil *Options means all defaults.
type Options struct {
	// Defaults are the Locker's default lock options (URL: ttl, refresh,
	// refresh_interval, retry_min, retry_max, metadata). Zero fields mean the
	// defaults documented on dlock.Options.
	Defaults dlock.Options

	// KeyPrefix starts every key and channel name (URL: prefix=app:).
	// Default "dlock:", or "" in compat mode.
	KeyPrefix string

	// Compat selects the layout shared with redsync: the lock key is
	// KeyPrefix+name, without fencing (URL: compat=true). Default false.
	Compat bool

	// NodeTimeout bounds each request to one node (URL: node_timeout=50ms).
	// A node that has not answered by then counts as failed for that
	// operation. Default TTL/5, at most MaxDefaultNodeTimeout; never more
	// than the TTL.
	NodeTimeout time.Duration

	// Drift is the clock drift margin subtracted from every lease's validity
	// (URL: drift=5ms). Default TTL/100 + 2ms.
	Drift time.Duration
}

// New returns a Locker over the application's clients, one per Redis
// master: an odd number, at least 3, each a different server. Closing the
// Locker does not close them.
//
// The clients must have ContextTimeoutEnabled set, or New fails with
// dlock.ErrInvalid: the Locker bounds every request with a context, and
// without it go-redis ignores context deadlines on reads, so that a request
// to a paused node would block until ReadTimeout instead of the node
// timeout. DialerRetries: 1 makes a request
// to a node that refuses connections fail at once, rather than after
// go-redis's dial retries (the clients Open makes are set up both ways).
//
// Each node must be one Redis server: a *goredis.Client, or a
// *goredis.FailoverClient (Sentinel) if the failover's guarantees are
// acceptable. A *goredis.ClusterClient or *goredis.Ring spreads keys over
// several servers and is refused with dlock.ErrInvalid: Redlock's argument
// needs independent single servers. The slice may be of any client type
// (for example []*goredis.Client).
func New[C goredis.UniversalClient](clients []C, opts *Options) (*dlock.Locker, error) {
	ucs := make([]goredis.UniversalClient, len(clients))
	for i, c := range clients {
		ucs[i] = c
	}
	d, err := newDriver(ucs, opts, false)
	if err != nil {
		return nil, err
	}
	return dlock.New(d, &d.defaults)
}

func newDriver(clients []goredis.UniversalClient, opts *Options, ownsClients bool) (*driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	switch n := len(clients); {
	case n < 3:
		return nil, invalid("%d nodes: Redlock needs at least 3", n)
	case n%2 == 0:
		return nil, invalid("%d nodes: use an odd number (an even one tolerates no more failures than one node fewer)", n)
	case o.NodeTimeout < 0:
		return nil, invalid("negative node timeout %v", o.NodeTimeout)
	case o.Drift < 0:
		return nil, invalid("negative drift %v", o.Drift)
	}
	d := &driver{
		quorum:      len(clients)/2 + 1,
		prefix:      o.KeyPrefix,
		compat:      o.Compat,
		nodeTimeout: o.NodeTimeout,
		drift:       o.Drift,
		ownsClients: ownsClients,
		defaults:    o.Defaults,
		id:          newID(),
		watching:    map[string]map[*releaseWatch]struct{}{},
		live:        map[string]bool{},
		gone:        map[string]goneWait{},
		waits:       map[string]*wait{},
		held:        map[string]*handle{},
		quit:        make(chan struct{}),
	}
	if d.prefix == "" && !d.compat {
		d.prefix = DefaultKeyPrefix
	}
	for i, c := range clients {
		if c == nil || reflect.ValueOf(c).IsNil() {
			return nil, invalid("client %d is nil", i)
		}
		switch c := c.(type) {
		case *goredis.ClusterClient, *goredis.Ring:
			return nil, invalid("client %d is a %T: each Redlock node must be a single server (*redis.Client)", i, c)
		case *goredis.Client:
			if !c.Options().ContextTimeoutEnabled {
				return nil, invalid("client %d ignores context deadlines: set ContextTimeoutEnabled: true in its Options (the Locker bounds every request with the node timeout)", i)
			}
		}
		if slices.Index(clients, c) != i {
			return nil, invalid("client %d is given twice", i)
		}
		nd := &node{c: c, name: nodeName(i, c)}
		// A hand-off's payload starts with the id of the wait it is for.
		nd.hub = redishub.New(c, "redlock", func(p string) (string, bool) {
			if p == "" {
				return "", false
			}
			d.missed(i, p)
			id, _, _ := strings.Cut(p, ":")
			return id, true
		})
		d.nodes = append(d.nodes, nd)
	}
	return d, nil
}

// nodeName names node i in errors: its index and, when known, its address.
func nodeName(i int, c goredis.UniversalClient) string {
	if c, ok := c.(*goredis.Client); ok {
		return fmt.Sprintf("node %d (%s)", i, c.Options().Addr)
	}
	return fmt.Sprintf("node %d", i)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: redlock: %s", dlock.ErrInvalid, fmt.Sprintf(format, args...))
}

type driver struct {
	nodes       []*node
	quorum      int
	prefix      string
	compat      bool
	nodeTimeout time.Duration // zero: the default for the TTL
	drift       time.Duration // zero: dlock's default
	ownsClients bool
	defaults    dlock.Options // New's Options.Defaults
	addr        string        // the redacted URL, when opened from one

	id string // names this Locker's channels and tickets (see release.lua)

	wmu      sync.Mutex
	watching map[string]map[*releaseWatch]struct{} // by name
	live     map[string]bool                       // the ids of the waiters watching
	gone     map[string]goneWait                   // the waiters that left, by id (at most maxGone)
	goneIDs  []string                              // gone's ids, oldest first
	waits    map[string]*wait                      // by Request.Wait (see WatchWait)
	closing  bool

	hmu  sync.Mutex
	held map[string]*handle // the leases granted and not yet ended, by their Request.Token (see Abandon)

	// bg counts the requests still running after the call that made them
	// returned (a majority had decided): each is bounded by the node timeout.
	// A release's retries of the nodes that did not answer (see
	// releaseLater) also run under it, until Close closes quit.
	bg   sync.WaitGroup
	quit chan struct{}
}

// node is one Redis master.
type node struct {
	c    goredis.UniversalClient
	name string
	hub  *redishub.Hub
}

// Capabilities declares no Semaphore, RWLock or Metadata: see the package
// doc's "Semaphores, read/write locks and elections" for why.
func (d *driver) Capabilities() dlock.Capabilities {
	return dlock.Capabilities{
		Fencing:      !d.compat,
		NotifiedWait: true,
		MinTTL:       MinTTL,
		Steal:        true,
		Records:      !d.compat, // record.go
	}
}

// keys returns the keys of name: the lock key, the waiters' queue and, in
// the default layout, the fencing counter.
func (d *driver) keys(name string) []string {
	if d.compat {
		lock := d.prefix + name
		return []string{lock, lock + ":waiters"}
	}
	lock := d.prefix + "{" + name + "}"
	return []string{lock, lock + ":waiters", lock + ":fence"}
}

// channel is the pub/sub channel on which releases of name are handed to
// this Locker's waiters (see release.lua).
func (d *driver) channel(name string) string { return d.keys(name)[0] + ":released:" + d.id }

// timeout is the per-node timeout for a lock of the given TTL.
func (d *driver) timeout(ttl time.Duration) time.Duration {
	t := d.nodeTimeout
	if t <= 0 {
		t = min(ttl/5, MaxDefaultNodeTimeout)
	}
	return min(t, ttl)
}

// driftFor is the drift margin for a lock of the given TTL.
func (d *driver) driftFor(ttl time.Duration) time.Duration {
	if d.drift > 0 {
		return d.drift
	}
	return ttl/100 + 2*time.Millisecond
}

// millis rounds ttl up to whole milliseconds: PX cannot say less, and a TTL
// must never be shortened.
func millis(ttl time.Duration) int64 {
	return int64((ttl + time.Millisecond - 1) / time.Millisecond)
}

// nodeCtx bounds one request to a node: the node timeout, and ctx unless
// detached (a request whose outcome matters after the caller has left, or
// whose connection should not be cut when the caller stops waiting).
func nodeCtx(ctx context.Context, timeout time.Duration, detached bool) (context.Context, context.CancelFunc) {
	if detached {
		ctx = context.WithoutCancel(ctx)
	}
	return context.WithTimeout(ctx, timeout)
}

// Watch registers a waiter for name: it subscribes to this Locker's
// hand-off channel of name on every node and, once a node confirmed, adds
// the waiter's ticket to that node's queue; it returns once a majority has
// done both (a release deletes the lock on at least a majority, one of
// which hands it to the first waiter). See releaseWatch for when the waiter
// is woken.
func (d *driver) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	rw, stop, err := d.watch(ctx, name, newID(), 0)
	if err != nil {
		return nil, nil, err
	}
	return rw.c, stop, nil
}

// wait is the watch of one waiting Acquire (Request.Wait).
type wait struct {
	rw   *releaseWatch
	stop func()
}

// WatchWait is Watch for the wait req belongs to (dlockdriver.WaitNotifier).
// When an attempt of this wait found this Locker's hand-off channel of the
// name subscribed on every node already (a waiter of the name left it
// lingering), it watched before sending its request, which queued the
// waiter's ticket where the lock was busy: the wait is queued, and a
// release after that attempt reaches the watch, so the Locker waits without
// another attempt. Otherwise WatchWait watches now, and the next attempt
// queues the ticket.
func (d *driver) WatchWait(ctx context.Context, req dlockdriver.Request) (<-chan struct{}, bool, error) {
	d.wmu.Lock()
	w := d.waits[req.Wait]
	d.wmu.Unlock()
	if w != nil {
		return w.rw.c, true, nil
	}
	rw, stop, err := d.watch(ctx, req.Name, newToken(), millis(req.TTL))
	if err != nil {
		return nil, false, err
	}
	d.wmu.Lock()
	d.waits[req.Wait] = &wait{rw: rw, stop: stop}
	d.wmu.Unlock()
	return rw.c, false, nil
}

// EndWait stops the watch of the wait req belongs to, if it has one.
func (d *driver) EndWait(req dlockdriver.Request) {
	d.wmu.Lock()
	w := d.waits[req.Wait]
	delete(d.waits, req.Wait)
	d.wmu.Unlock()
	if w != nil {
		w.stop()
	}
}

// prewatch, for an attempt of a wait, watches the name before the attempt
// is sent when that costs no round trip (the hand-off channel is subscribed
// on every node), so that the attempt queues the waiter if the lock is busy.
func (d *driver) prewatch(ctx context.Context, req dlockdriver.Request) {
	if req.Wait == "" {
		return
	}
	d.wmu.Lock()
	w := d.waits[req.Wait]
	d.wmu.Unlock()
	if w != nil {
		return
	}
	channel := d.channel(req.Name)
	for _, nd := range d.nodes {
		if !nd.hub.Ready(channel) {
			return
		}
	}
	rw, stop, err := d.watch(ctx, req.Name, newToken(), millis(req.TTL))
	if err != nil {
		return // the attempt goes on without: WatchWait watches
	}
	d.wmu.Lock()
	d.waits[req.Wait] = &wait{rw: rw, stop: stop}
	d.wmu.Unlock()
}

// watch is Watch, returning the waiter itself: id is its hand-off token
// (hex), px the TTL in ms a hand-off grants it (0: none, the waiter is only
// woken).
func (d *driver) watch(ctx context.Context, name, id string, px int64) (*releaseWatch, func(), error) {
	channel := d.channel(name)
	n, q := len(d.nodes), d.quorum
	rw := newReleaseWatch(n, q) // its since is now, before any attempt carries its ticket
	rw.d, rw.name, rw.keys, rw.id, rw.px = d, name, d.keys(name), id, px
	rw.ticket = d.id + ":" + id + ":" + strconv.FormatInt(px, 10)
	rw.score = rw.since.UnixMicro()
	d.wmu.Lock()
	if d.watching[name] == nil {
		d.watching[name] = map[*releaseWatch]struct{}{}
	}
	d.watching[name][rw] = struct{}{}
	d.live[rw.id] = true
	d.wmu.Unlock()
	wctx, cancel := context.WithCancel(context.Background())
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		watchers []*redishub.Watcher
	)
	results := make(chan error, n)
	for i, nd := range d.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			notify := func(p string, message bool) { rw.notify(i, p, message) }
			// The first outcome counts toward the quorum; a node whose
			// watch failed (its pub/sub connection broke before the
			// subscription was confirmed) is watched again until it works
			// or the watch stops: without that, the waiter would go
			// unsubscribed there for the rest of its wait, deaf to that
			// node's hand-offs (and the node drops tickets nobody hears).
			retry := backoff.Backoff{Min: watchRetryMin, Max: watchRetryMax}
			for first := true; ; first = false {
				x, err := nd.hub.Watch(wctx, channel, rw.id, notify)
				if err == nil {
					mu.Lock()
					watchers = append(watchers, x)
					mu.Unlock()
				}
				if first {
					if err != nil {
						results <- fmt.Errorf("%s: %w", nd.name, err)
					} else {
						results <- nil
					}
				} else if err == nil {
					// A release may have gone unheard meanwhile, and the
					// node may have dropped the ticket: look again, which
					// registers it there.
					rw.notify(i, "", false)
				}
				if err == nil || errors.Is(err, dlock.ErrClosed) || !retry.Sleep(wctx) {
					return
				}
			}
		}()
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			for _, x := range watchers {
				x.Stop()
			}
			rw.stop()
		})
	}
	var errs []error
	for ok := 0; ok < q; {
		select {
		case err := <-results:
			if err == nil {
				ok++
				continue
			}
			errs = append(errs, err)
			if len(errs) > n-q {
				stop()
				return nil, nil, fmt.Errorf("%w: watching %q: %w", ErrNoQuorum, channel, errors.Join(errs...))
			}
		case <-ctx.Done():
			stop()
			return nil, nil, ctx.Err()
		}
	}
	rw.mu.Lock()
	rw.armFallback()
	rw.mu.Unlock()
	return rw, stop, nil
}

func (d *driver) Close() error {
	d.wmu.Lock()
	if !d.closing {
		close(d.quit) // no more retries of releases in the background
	}
	d.closing = true // no more hand-offs passed on
	d.wmu.Unlock()
	d.bg.Wait() // bounded by the node timeout
	var errs []error
	for _, nd := range d.nodes {
		if err := nd.hub.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", nd.name, err))
		}
	}
	if d.ownsClients {
		for _, nd := range d.nodes {
			if err := nd.c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("redlock: closing the client of %s: %w", nd.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// fanout runs op on every node at once, each bounded by timeout, and
// returns where the results arrive, one per node. The channel is buffered:
// a caller that has decided, or whose ctx ended, may stop reading, and the
// requests still running finish in the background. They are detached from
// ctx: cancelling a request in flight would cost its connection.
func fanout[T any](d *driver, ctx context.Context, timeout time.Duration, op func(ctx context.Context, i int, nd *node) (T, error)) <-chan nodeResult[T] {
	results := make(chan nodeResult[T], len(d.nodes))
	for i, nd := range d.nodes {
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			nctx, cancel := nodeCtx(ctx, timeout, true)
			defer cancel()
			v, err := op(nctx, i, nd)
			if err != nil {
				err = fmt.Errorf("%s: %w", nd.name, err)
			}
			results <- nodeResult[T]{i, v, err}
		}()
	}
	return results
}

type nodeResult[T any] struct {
	i   int
	v   T
	err error
}

// handle is one held lease: its keys and token on every node.
type handle struct {
	d        *driver
	keys     []string
	token    string
	lease    string          // the Request.Token it was granted for (token, unless handed to a wait)
	fence    uint64          // the grant's fencing token: orders the records of its leases (record.go)
	acquired []chan struct{} // closed when the node's part of the acquisition is over

	mu       sync.Mutex
	ttl      time.Duration // the last TTL asked for, for node timeouts
	released []bool        // nodes from which the lock was deleted
	// unsure marks the nodes a release was sent to without an answer (a
	// timeout, a broken connection): a later "not held" from one of them
	// may be that release's (or its background retry's) deletion.
	unsure []bool

	// A lease granted by hand-offs: hand-offs to its wait heard after the
	// wait ended, to give back once the lease is released (see missed).
	ended bool
	late  []func()
}

// afterEnd runs give when the lease has been released (or its loss cleaned
// up), at once if it has.
func (h *handle) afterEnd(give func()) {
	h.mu.Lock()
	if !h.ended {
		h.late = append(h.late, give)
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	give()
}

// end marks the lease released and gives back what was handed to its wait
// meanwhile (see missed).
func (h *handle) end() {
	h.d.unhold(h.lease)
	h.mu.Lock()
	h.ended = true
	late := h.late
	h.late = nil
	h.mu.Unlock()
	for _, give := range late {
		give()
	}
}

// Refresh runs the compare-and-pexpire script on every node and succeeds
// once a majority extended the lock. It never re-creates the lock on a node
// that lost it. When a majority no longer holds the token, the lease is
// lost: it reports ErrNotHeld and removes what is left of the lock.
func (h *handle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	d := h.d
	n, q := len(d.nodes), d.quorum
	px := millis(ttl)
	h.mu.Lock()
	h.ttl = ttl
	h.mu.Unlock()
	results := fanout(d, ctx, d.timeout(ttl), func(ctx context.Context, _ int, nd *node) (bool, error) {
		r, err := refreshScript.Run(ctx, nd.c, h.keys[:1], h.token, px).Int64()
		return r == 1, err
	})
	var extended, notHeld int
	var errs []error
	for range n {
		var r nodeResult[bool]
		select {
		case r = <-results:
		case <-ctx.Done():
			return 0, fmt.Errorf("redlock: refreshing %q: %w", h.keys[0], ctx.Err())
		}
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.v:
			extended++
		default:
			notHeld++
		}
		if extended >= q {
			return time.Duration(px) * time.Millisecond, nil
		}
		if notHeld > n-q {
			h.cleanUp(ctx)
			return 0, fmt.Errorf("%w: redlock: %d of %d nodes no longer hold %q for this lease", dlock.ErrNotHeld, notHeld, n, h.keys[0])
		}
	}
	return 0, fmt.Errorf("%w: refreshing %q: %d of %d nodes extended it, %d do not hold it, %d failed: %w",
		ErrNoQuorum, h.keys[0], extended, n, notHeld, len(errs), errors.Join(errs...))
}

// cleanUp deletes, in the background, what is left of a lost lease's lock
// on the nodes that still have it, so that it does not stand in a
// contender's way until it expires.
func (h *handle) cleanUp(ctx context.Context) {
	defer h.end()
	for i, nd := range h.d.nodes {
		h.d.bg.Add(1)
		go func() {
			defer h.d.bg.Done()
			<-h.acquired[i] // bounded by the node timeout
			_, _ = nd.release(ctx, h.timeout(), true, h.keys, h.token, true)
		}()
	}
}

// hold records a granted lease until it ends (see Abandon).
func (d *driver) hold(lease string, h *handle) {
	h.lease = lease
	d.hmu.Lock()
	d.held[lease] = h
	d.hmu.Unlock()
}

// unhold forgets a lease that has ended, returning its handle if it was
// still recorded.
func (d *driver) unhold(lease string) *handle {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	h := d.held[lease]
	delete(d.held, lease)
	return h
}

// Abandon gives up the lock of a lease the Locker declared lost at its
// ValidUntil (dlockdriver.Abandoner): it releases it as Release does, on
// every node that may hold its token, handing it to the next waiter. A
// refresh of the lease still on its way to a node (sent before the loss,
// held up on the path long after the client stopped waiting for it) would
// otherwise extend the lock there for another TTL: it finds the lock gone
// if it arrives after the release, and the release removes what it
// extended if it arrived before. Both are token-checked, so neither touches
// a newer holder's lock.
//
// A token that is not a granted lease's costs nothing: the Locker also
// calls Abandon after every failed attempt that was not busy, and an
// acquisition gives back what it took by itself (see TryAcquire).
func (d *driver) Abandon(ctx context.Context, req dlockdriver.Request) error {
	h := d.unhold(req.Token)
	if h == nil {
		return nil
	}
	return h.Release(ctx)
}

func (h *handle) timeout() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.d.timeout(h.ttl)
}

// releaseRetryMin and releaseRetryMax bound the pause before a release asks
// again a node that did not answer.
const (
	releaseRetryMin = 20 * time.Millisecond
	releaseRetryMax = 500 * time.Millisecond
)

// Release runs the compare-and-delete script on every node (each after that
// node's part of the acquisition is over, so that a late grant is not left
// behind), waiting for every node up to the node timeout. It succeeds when
// the lock has been deleted from a majority (counting nodes where an earlier
// try deleted it), and reports ErrNotHeld when a majority no longer held it.
//
// The nodes that did not answer (a timeout, a broken connection) are asked
// again, after a backoff, until a majority has decided, ctx ends or three
// node timeouts have passed since the release began: a release short of a
// majority would otherwise leave the lock in everyone's way until it
// expires. Those still unanswered when Release returns are asked again in
// the background until the TTL has passed since the release began (the
// lock has then expired wherever it was left) or Close, so that neither a
// minority nor a majority that came back late keeps the lock. Every try is the token-checked script: it never deletes a lock
// that is not this lease's. A node that did not answer and then answers
// that it does not hold the lock counts as released: the lost answer may
// have been its deletion.
func (h *handle) Release(ctx context.Context) error {
	defer h.end()
	d := h.d
	n, q := len(d.nodes), d.quorum
	timeout := h.timeout()
	h.mu.Lock()
	done := slices.Clone(h.released)
	// until bounds every retry: the lock has expired wherever it was left
	// by then. The caller waits for retries up to three node timeouts at
	// most (and its ctx), so that a majority down does not hold Release
	// (or Close) for a whole TTL; the background goes on to until.
	start := time.Now()
	until := start.Add(h.ttl)
	wait := start.Add(min(h.ttl, 3*timeout))
	h.mu.Unlock()
	type result struct {
		deleted bool
		err     error
	}
	results := make([]result, n)
	// The nodes whose part of the acquisition is over share one bound (a
	// timer per request costs more than the rest of the client's work);
	// the others get theirs once it is.
	shared, cancel := nodeCtx(ctx, timeout, false)
	defer cancel()
	var wg sync.WaitGroup
	for i, nd := range d.nodes {
		if done[i] {
			results[i].deleted = true
			continue
		}
		nctx := shared
		select {
		case <-h.acquired[i]:
		default:
			nctx = nil
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if nctx == nil {
				select {
				case <-h.acquired[i]:
				case <-ctx.Done():
					results[i].err = fmt.Errorf("%s: %w", nd.name, ctx.Err())
					return
				}
				var cancel context.CancelFunc
				nctx, cancel = nodeCtx(ctx, timeout, false)
				defer cancel()
			}
			results[i].deleted, results[i].err = nd.releaseIn(nctx, h.keys, h.token, true)
		}()
	}
	wg.Wait()
	var deleted, gone, notHeld int
	var failed []int
	h.mu.Lock()
	for i, r := range results {
		switch {
		case r.err != nil:
			failed = append(failed, i)
			h.unsure[i] = true
		case r.deleted:
			deleted++
			h.released[i] = true
		case h.unsure[i]:
			gone++ // an earlier release, unanswered, may have deleted it
		default:
			notHeld++
		}
	}
	h.mu.Unlock()
	retry := backoff.Backoff{Min: releaseRetryMin, Max: releaseRetryMax}
	for len(failed) > 0 && deleted+gone < q && notHeld <= n-q && pause(ctx.Done(), retry.Next(), wait) {
		for _, i := range failed {
			nd := d.nodes[i]
			wg.Add(1)
			go func() {
				defer wg.Done()
				nctx, cancel := nodeCtx(ctx, min(timeout, time.Until(wait)), false)
				defer cancel()
				results[i].deleted, results[i].err = nd.releaseIn(nctx, h.keys, h.token, true)
			}()
		}
		wg.Wait()
		left := failed[:0]
		h.mu.Lock()
		for _, i := range failed {
			switch r := results[i]; {
			case r.err != nil:
				left = append(left, i)
			case r.deleted:
				deleted++
				h.released[i] = true
			default:
				gone++
			}
		}
		h.mu.Unlock()
		failed = left
	}
	var errs []error
	for _, i := range failed {
		errs = append(errs, results[i].err)
	}
	h.releaseLater(failed, until)
	switch {
	case deleted+gone >= q:
		return nil
	case notHeld > n-q:
		return fmt.Errorf("%w: redlock: %d of %d nodes no longer held %q for this lease", dlock.ErrNotHeld, notHeld, n, h.keys[0])
	}
	return fmt.Errorf("%w: releasing %q: deleted on %d of %d nodes, %d did not hold it, %d failed: %w",
		ErrNoQuorum, h.keys[0], deleted+gone, n, notHeld, len(errs), errors.Join(errs...))
}

// releaseLater asks the nodes again, in the background, until each has
// answered, until passes (the lock has expired there by then) or the
// driver closes.
func (h *handle) releaseLater(nodes []int, until time.Time) {
	d := h.d
	timeout := h.timeout()
	for _, i := range nodes {
		nd := d.nodes[i]
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			select {
			case <-h.acquired[i]: // bounded by the node timeout
			case <-d.quit:
				return
			}
			retry := backoff.Backoff{Min: releaseRetryMin, Max: releaseRetryMax}
			for pause(d.quit, retry.Next(), until) {
				nctx, cancel := nodeCtx(context.Background(), min(timeout, time.Until(until)), true)
				deleted, err := nd.releaseIn(nctx, h.keys, h.token, true)
				cancel()
				if err == nil {
					if deleted {
						h.mu.Lock()
						h.released[i] = true
						h.mu.Unlock()
					}
					return
				}
			}
		}()
	}
}

// pause waits for d, and reports whether it did, with time left before
// until: false, at once, if stop is closed first or d would reach until.
func pause(stop <-chan struct{}, d time.Duration, until time.Time) bool {
	if !time.Now().Add(d).Before(until) {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}

// Held reads the lock key on every node: true once a majority holds the
// token, false once a majority does not (the lease is then lost, and what
// is left of its lock removed, as Refresh does).
func (h *handle) Held(ctx context.Context) (bool, error) {
	d := h.d
	n, q := len(d.nodes), d.quorum
	results := fanout(d, ctx, h.timeout(), func(ctx context.Context, _ int, nd *node) (bool, error) {
		v, err := nd.c.Get(ctx, h.keys[0]).Result()
		switch {
		case errors.Is(err, goredis.Nil):
			return false, nil
		case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
			return false, nil // not a lock of ours
		case err != nil:
			return false, err
		}
		return v == h.token, nil
	})
	var holds, not int
	var errs []error
	for range n {
		var r nodeResult[bool]
		select {
		case r = <-results:
		case <-ctx.Done():
			return false, fmt.Errorf("redlock: reading %q: %w", h.keys[0], ctx.Err())
		}
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.v:
			holds++
		default:
			not++
		}
		if holds >= q {
			return true, nil
		}
		if not > n-q {
			h.cleanUp(ctx)
			return false, nil
		}
	}
	return false, fmt.Errorf("%w: reading %q: %d of %d nodes hold it, %d do not, %d failed: %w",
		ErrNoQuorum, h.keys[0], holds, n, not, len(errs), errors.Join(errs...))
}

// release runs release.lua on the node: it reports whether the node held
// token and deleted it.
func (nd *node) release(ctx context.Context, timeout time.Duration, detached bool, keys []string, token string, publish bool) (bool, error) {
	nctx, cancel := nodeCtx(ctx, timeout, detached)
	defer cancel()
	return nd.releaseIn(nctx, keys, token, publish)
}

// releaseIn is release bounded by nctx, a context made by nodeCtx.
func (nd *node) releaseIn(nctx context.Context, keys []string, token string, publish bool) (bool, error) {
	pub := "0"
	if publish {
		pub = "1"
	}
	r, err := releaseScript.Run(nctx, nd.c, keys, token, pub).Int64()
	if err != nil {
		return false, fmt.Errorf("%s: %w", nd.name, err)
	}
	return r == 1, nil
}
