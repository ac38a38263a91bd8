// Package redis is the dlock driver for a single Redis server (or one
// primary with replicas), built on github.com/redis/go-redis/v9.
//
// # URLs
//
//	redis://[user:pass@]host:port[/db][?params]
//	rediss://[user:pass@]host:port[/db]?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem
//
// Parameters:
//
//   - The lock options of dlock.Options: ttl, refresh, refresh_interval,
//     retry_min, retry_max, metadata (see dlock.OptionsFromQuery).
//   - prefix=app: sets Options.KeyPrefix; compat=true sets Options.Compat.
//   - rediss only: tls_ca (PEM file of CA certificates to trust instead of
//     the system's), tls_cert and tls_key (PEM files of a client
//     certificate and its key, both or neither), tls_server_name (the name
//     to verify the server's certificate against; default the URL's host),
//     tls_insecure_skip_verify=true (no verification: tests only). go-redis's
//     own skip_verify is accepted too.
//   - Everything go-redis's ParseURL accepts: dial_timeout, read_timeout,
//     write_timeout, pool_size, max_retries, client_name, protocol, …
//
// An ACL user needs the scripting commands, the keys ~P* and, for notified
// waiting, the channels &P* (P the key prefix). Without rights on the
// channels, locks still work: releases do not announce themselves and waiters
// poll between RetryMin and RetryMax.
//
// Unknown parameters are rejected. Open pings the server, bounded by its ctx,
// so a wrong address or credential fails there; the Locker then owns the
// client it made and closes it on Close. The client honours context deadlines
// (ContextTimeoutEnabled).
//
// # Guarantees
//
// One Redis node decides: a lease is exclusive while it is valid (until its
// ValidUntil), because the lock key lives on that node for the TTL and only
// the token's owner can extend or delete it. Release and Refresh compare the
// token first, so they never touch another holder's lock, and Refresh never
// re-creates a lock that expired.
//
// What it does not survive:
//
//   - Failover: Redis replicates asynchronously, so a replica promoted after
//     a primary crash may lack a lock that was granted (two holders), or
//     still have one that was released. Protect the resource with the
//     fencing token (Lease.Fence). The counter is replicated asynchronously
//     too, so after a failover it may hand out a token again; a resource
//     that accepts only tokens above the highest it has seen then refuses
//     the second holder's writes instead of interleaving them.
//   - Restart: the test and reference servers run without persistence, so a
//     restart forgets every lock (a holder and the next taker may then both
//     hold a valid lease) and every fencing counter. Fencing tokens still
//     strictly increase across it, because a missing counter starts again at
//     the server's clock (see Fencing). With AOF (appendonly yes, appendfsync
//     always) locks and counters survive a restart; Capabilities reports
//     SurvivesRestart false because that depends on the server's
//     configuration.
//   - Process pauses: a holder paused (GC, SIGSTOP, a VM migration) past its
//     ValidUntil may resume believing it holds a lock that expired and was
//     taken. The lease reports the loss, but only once the process runs
//     again; pass Lease.Fence to the resource so that it can refuse the stale
//     holder's writes.
//
// Fencing (default layout): every grant, a handoff to a queued waiter or an
// expiry takeover included, advances the name's counter in the script that
// sets the lock, and the lease's token (Lease.Fence) is the new value. A
// counter that exists is INCRed. A missing one (the name's first use, or
// lost: a restart without persistence, an eviction under an allkeys-*
// maxmemory policy, a DEL) starts at the server's TIME in microseconds. A
// counter grows by one per grant and a grant costs at least one script run
// on the server, which takes longer than a microsecond, so a counter never
// outruns the microseconds elapsed since it started; a lost counter therefore
// starts again above every token handed out before it was lost, provided the
// server's clock has not gone back since by more than the time that passed.
// The assumption is the server's clock: let NTP slew it, not step it back.
// Tokens are then microsecond-scale numbers (about 1.8e15 in 2026), far
// inside a uint64 and exact in Lua's numbers until 2^53 (the year 2255). A
// counter of an older version, started at 1, keeps counting from its value;
// it jumps to the clock only when it is lost. So tokens keep increasing
// across a restart, but not across a failover to a replica that has a stale
// counter (above).
//
// Default layout: waiting is a FIFO queue on the server (Capabilities.FIFO).
// A waiter enqueues itself (in the order the server sees its requests) and
// keeps its entry alive; a release hands the lock straight to the first
// live waiter (the release script sets the lock to that waiter's token and
// counts its fence) and PUBLISHes a grant message on the channel of that
// waiter's Locker, which hands it to that waiter alone: no herd (a grant
// reaches one connection, however many processes wait), and no further
// round trip before the waiter holds it.
// A holder that expires without releasing is taken over by the first live
// waiter, whichever waiter (or TryAcquire) finds the lock free first: a
// TryAcquire never takes a lock ahead of a live waiter, and never enqueues.
// A waiter whose ctx ends leaves the queue (and passes on a lock handed to it
// meanwhile) before Acquire returns, waiting up to 250ms for the server.
// A dead waiter (crashed, partitioned) is skipped once its entry has
// expired; until then a release may hand it the lock, which then stays idle
// for that lock's TTL plus at most a third of the next waiter's entry
// lifetime (see Layout). Fencing tokens count every handoff.
//
// Compat layout: waiting is notified: releases PUBLISH on a channel that
// waiters subscribe to, so a waiter retries as soon as the lock is released.
// A lock that expires without a release publishes nothing; waiters then
// retry when the holder's remaining TTL (read with the failed attempt) has
// passed. Locks are not granted in arrival order.
//
// Both use one pub/sub connection per Locker. A channel stays subscribed
// for 2s after its last waiter left (at most 1024 channels at a
// time), so that a name taken in a loop costs no SUBSCRIBE per wait. If the
// connection fails, waiters are woken to look again (a default-layout waiter
// finds there a lock handed to it meanwhile), the connection is replaced and
// the channels subscribed again; meanwhile they retry at the holder's
// remaining TTL. A connection that stays silent is found out by PING within
// seconds. A default-layout waiter that cannot subscribe at all (no rights on
// the channel) stays queued and runs the acquire script at least every
// 200ms to find a lock handed to it.
//
// A key without expiry under a lock's name (set by something else) counts as
// held; compat waiters then poll it at Options.RetryMax, default-layout
// waiters at the renewal interval of their entry.
//
// An attempt cut short by its ctx after the request went out may still have
// taken the lock; the Locker then removes it in the background with the
// release script and that attempt's own token, so it does not linger until
// its TTL (unless the request itself arrives after the removal).
//
// # Layout
//
// Default layout, with P the key prefix (default "dlock:") and N the lock name:
//
//	P{N}            string: the lease token, with the TTL as its expiry
//	                (SET NX PX); deleted on release
//	P{N}:fence      integer: the fencing counter, advanced with every grant
//	                in the same script as the SET: INCRed, or started at
//	                the server's TIME in µs when missing (see Fencing)
//	P{N}:queue      sorted set: the waiting tokens, scored by arrival (the
//	                server's TIME in µs at the first enqueue; renewals keep
//	                the place)
//	P{N}:waiters    hash: token -> "deadline_ms ttl_ms channel", a waiter's
//	                entry: live until deadline (server time), renewed by the
//	                waiter; the TTL is the one the waiter asked for; the
//	                grant channel of the waiter's Locker
//	Pgrants:<id>    pub/sub channel of one Locker (id: 64 random bits):
//	                "g:<token>:<fence>" when a release or an expiry takeover
//	                hands a lock to one of its waiters
//	P{N}:released   pub/sub channel: an empty message on a release that
//	                found only dead entries queued (nothing when the queue is
//	                empty: nobody waits then)
//
// A waiter's entry lives lifetime = max(TTL, 1s) after its last renewal;
// waiting, it renews it at least every lifetime/3. Dead entries are dropped
// when they reach the head of the queue. The queue and the hash vanish when
// their last entry is removed (Redis deletes empty sets and hashes), and
// carry an expiry at least as late as every entry's deadline, so entries
// of waiters that died vanish even when no one comes to remove them.
//
// The counter's value is always the current holder's fence (every grant
// SETs the lock and advances the counter in one script, nothing else changes
// either): a waiter that missed its grant message finds the lock holding
// its token and reads its fence there.
//
// The braces make N (up to any "}" in it) the hash tag, so a lock, its
// counter and its queue share a cluster slot. The counter persists by design: it is one
// small key per name ever locked, and it is what makes fencing tokens
// strictly increase across holders and expiry takeovers. A counter deleted
// (or evicted) starts again at the server's clock, so deleting one does not
// break fencing under the clock assumption above, but every deleted counter
// is one more place that assumption must hold.
//
// Compat layout (Options.Compat, URL compat=true), with P defaulting to "":
//
//	PN              string: the lease token, SET NX PX, compare-and-delete
//	PN:released     pub/sub channel: an empty message on every release
//
// This is the layout of github.com/go-redsync/redsync/v4 (one pool) and
// github.com/bsm/redislock, so dlock, redsync and redislock locks on the same
// name exclude each other. There is no fencing counter, so Capabilities
// reports no Fencing. redsync and redislock do not publish when they release:
// a dlock waiter behind one of their locks retries at the holder's remaining
// TTL.
//
// Lock metadata (Options.Metadata) is not stored.
package redis

import (
	"context"
	crand "crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redishub"
	goredis "github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire.lua
	acquireLua    string
	acquireScript = goredis.NewScript(acquireLua)

	//go:embed release.lua
	releaseLua    string
	releaseScript = goredis.NewScript(releaseLua)

	//go:embed refresh.lua
	refreshLua    string
	refreshScript = goredis.NewScript(refreshLua)
)

// DefaultKeyPrefix is the key prefix of the default layout.
const DefaultKeyPrefix = "dlock:"

// MinTTL is the shortest TTL the driver accepts.
const MinTTL = 10 * time.Millisecond

// Options configure a Locker. A nil *Options means all defaults.
type Options struct {
	// Defaults are the Locker's default lock options (URL: ttl, refresh,
	// refresh_interval, retry_min, retry_max, metadata). Zero fields mean the
	// defaults documented on dlock.Options.
	Defaults dlock.Options

	// KeyPrefix starts every key and channel name (URL: prefix=app:).
	// Default "dlock:", or "" in compat mode.
	KeyPrefix string

	// Compat selects the layout shared with redsync and redislock: the lock
	// key is KeyPrefix+name, without fencing (URL: compat=true). Default
	// false. See the package doc's Layout.
	Compat bool
}

// New returns a Locker on the application's client. Closing the Locker does
// not close the client.
//
// The client should have ContextTimeoutEnabled set: the Locker bounds every
// call with a context, and without it go-redis ignores context deadlines on
// reads, so a call to an unreachable server blocks until ReadTimeout instead.
// New works with any UniversalClient; on a cluster the hash-tagged layout
// keeps each lock's keys in one slot, and the guarantees are those of the
// shard's primary.
func New(client goredis.UniversalClient, opts *Options) (*dlock.Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redis: nil client", dlock.ErrInvalid)
	}
	d := newDriver(client, opts, false)
	if d.compat {
		return dlock.New(d, &d.defaults)
	}
	return dlock.New(&queueDriver{d}, &d.defaults)
}

func newDriver(client goredis.UniversalClient, opts *Options, ownsClient bool) *driver {
	var o Options
	if opts != nil {
		o = *opts
	}
	d := &driver{
		c:          client,
		prefix:     o.KeyPrefix,
		compat:     o.Compat,
		ownsClient: ownsClient,
	}
	if d.prefix == "" && !d.compat {
		d.prefix = DefaultKeyPrefix
	}
	d.hub = redishub.New(client, "redis", routeGrant)
	d.grants = d.prefix + "grants:" + newID()
	d.defaults = o.Defaults
	return d
}

// Ping checks that the server answers, for dlock.Open.
func (d *driver) Ping(ctx context.Context) error {
	if err := d.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: connecting to %s: %w", d.addr, err)
	}
	return nil
}

type driver struct {
	c          goredis.UniversalClient
	defaults   dlock.Options // New's Options.Defaults
	addr       string        // the redacted URL, when opened from one
	prefix     string
	compat     bool
	ownsClient bool
	hub        *redishub.Hub
	grants     string         // default layout: this Locker's grant channel
	bg         sync.WaitGroup // leaves still running after their Acquire returned
}

// newID returns 64 random bits, hex-encoded: a Locker's grant channel.
func newID() string {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

func (d *driver) Capabilities() dlock.Capabilities {
	return dlock.Capabilities{
		Fencing:      !d.compat,
		FIFO:         !d.compat,
		NotifiedWait: true,
		MinTTL:       MinTTL,
	}
}

// keys returns the keys of name: in the compat layout just the lock key; in
// the default layout the lock, the fencing counter, the queue and the waiter
// entries, in the order the scripts take them.
func (d *driver) keys(name string) []string {
	if d.compat {
		return []string{d.prefix + name}
	}
	lock := d.prefix + "{" + name + "}"
	return []string{lock, lock + ":fence", lock + ":queue", lock + ":waiters"}
}

// channel is the pub/sub channel on which releases of name are announced.
func (d *driver) channel(name string) string {
	return d.keys(name)[0] + ":released"
}

// millis rounds ttl up to whole milliseconds: PX cannot say less, and a TTL
// must never be shortened.
func millis(ttl time.Duration) int64 {
	return int64((ttl + time.Millisecond - 1) / time.Millisecond)
}

// TryAcquire runs acquire.lua: one round trip whether the lock is free or
// not. (In the compat layout a plain SET NX PX costs the same when the lock
// is free, but needs a second round trip for the holder's PTTL when not.)
func (d *driver) TryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	keys := d.keys(req.Name)
	token := any(req.Token) // boxed once for every call of the lease
	if d.compat {
		px := millis(req.TTL)
		n, err := acquireScript.Run(ctx, d.c, keys, token, px).Int64()
		if err != nil {
			return nil, fmt.Errorf("redis: acquiring %q: %w", keys[0], err)
		}
		if n <= 0 {
			return nil, busy(n)
		}
		return d.grant(keys, token, px, 0), nil
	}
	r, err := d.acquire(ctx, keys, token, req.TTL, 0)
	if err != nil {
		return nil, err
	}
	if r.kind == replyBusy {
		return nil, busy(r.busy)
	}
	return d.grant(keys, token, r.px, r.fence), nil
}

func (d *driver) grant(keys []string, token any, px int64, fence uint64) *dlockdriver.Grant {
	return &dlockdriver.Grant{
		Handle: &handle{d: d, keys: keys, token: token},
		TTL:    time.Duration(px) * time.Millisecond,
		Fence:  fence,
	}
}

// busy turns acquire.lua's negative or zero reply into a *dlockdriver.BusyError.
func busy(n int64) error {
	if n == 0 {
		return dlockdriver.Busy(0) // no expiry: the holder's remaining time is unknown
	}
	ms := -1 - n
	if ms == 0 {
		// Less than a millisecond left: retry at once, not at RetryMax.
		return dlockdriver.Busy(time.Microsecond)
	}
	return dlockdriver.Busy(time.Duration(ms) * time.Millisecond)
}

// Abandon removes the lock if req.Token holds it: the attempt that took it
// failed on the client's side (ctx ended or the reply was lost after the
// request went out). It is the release script, so waiters hear of it. An
// attempt delayed in the network past its abandon still takes the lock,
// which then lasts until its TTL.
func (d *driver) Abandon(ctx context.Context, req dlockdriver.Request) error {
	keys := d.keys(req.Name)
	if err := releaseScript.Run(ctx, d.c, keys, req.Token).Err(); err != nil {
		return fmt.Errorf("redis: abandoning an attempt on %q: %w", keys[0], err)
	}
	return nil
}

// Watch watches name's release channel: any message on it (a release, a
// lost pub/sub connection) signals the returned channel.
func (d *driver) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	c := make(chan struct{}, 1)
	x, err := d.hub.Watch(ctx, d.channel(name), "", func(string, bool) { redishub.Signal(c) })
	if err != nil {
		return nil, nil, err
	}
	return c, x.Stop, nil
}

// grantWatch is a queued waiter's watch of its Locker's grant channel and
// of the name's release channel: a grant message to its token (the hub
// routes those to it alone), or any message on the release channel that is
// not a grant, signals c.
type grantWatch struct {
	grants, released *redishub.Watcher
	c                chan struct{}
	fence            atomic.Uint64 // the highest fence of the grants to the token; 0: none
}

func (d *driver) watchGrants(ctx context.Context, channel, token string) (*grantWatch, error) {
	g := &grantWatch{c: make(chan struct{}, 1)}
	notify := func(payload string, _ bool) {
		// Called one at a time, under the hub's lock.
		if _, f, ok := parseGrant(payload); ok && f > g.fence.Load() {
			g.fence.Store(f)
		}
		redishub.Signal(g.c)
	}
	var err error
	if g.grants, err = d.hub.Watch(ctx, d.grants, token, notify); err != nil {
		return nil, err
	}
	if g.released, err = d.hub.Watch(ctx, channel, token, notify); err != nil {
		g.grants.Stop()
		return nil, err
	}
	return g, nil
}

// Stop ends both watches.
func (g *grantWatch) Stop() {
	g.grants.Stop()
	g.released.Stop()
}

// routeGrant gives a grant message, "g:<token>:<fence>" (a lock handed by
// the queue scripts to the waiter of that token), to that waiter alone.
func routeGrant(payload string) (string, bool) {
	token, _, ok := parseGrant(payload)
	return token, ok
}

// parseGrant reads a grant message, "g:<token>:<fence>".
func parseGrant(payload string) (token string, fence uint64, ok bool) {
	rest, ok := strings.CutPrefix(payload, "g:")
	if !ok {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return "", 0, false
	}
	f, err := strconv.ParseUint(rest[i+1:], 10, 64)
	if err != nil || f == 0 {
		return "", 0, false
	}
	return rest[:i], f, true
}

func (d *driver) Close() error {
	d.bg.Wait() // bounded by leaveTimeout
	err := d.hub.Close()
	if d.ownsClient {
		if cerr := d.c.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("redis: closing the client: %w", cerr))
		}
	}
	return err
}

// handle is one held lease: its keys and token.
type handle struct {
	d     *driver
	keys  []string // the layout's keys, lock key first
	token any      // the lease token, a string
}

func (h *handle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	px := millis(ttl)
	n, err := refreshScript.Run(ctx, h.d.c, h.keys[:1], h.token, px).Int64()
	if err != nil {
		return 0, fmt.Errorf("redis: refreshing %q: %w", h.keys[0], err)
	}
	if n == 0 {
		return 0, fmt.Errorf("%w: redis: %q does not hold this lease's token", dlock.ErrNotHeld, h.keys[0])
	}
	return time.Duration(px) * time.Millisecond, nil
}

func (h *handle) Release(ctx context.Context) error {
	n, err := releaseScript.Run(ctx, h.d.c, h.keys, h.token).Int64()
	if err != nil {
		return fmt.Errorf("redis: releasing %q: %w", h.keys[0], err)
	}
	if n == 0 {
		return fmt.Errorf("%w: redis: %q does not hold this lease's token", dlock.ErrNotHeld, h.keys[0])
	}
	return nil
}

func (h *handle) Held(ctx context.Context) (bool, error) {
	v, err := h.d.c.Get(ctx, h.keys[0]).Result()
	if errors.Is(err, goredis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("redis: reading %q: %w", h.keys[0], err)
	}
	return v == h.token.(string), nil
}
