package redis

import (
	"context"
	crand "crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisclient"
	"github.com/dlock/dlock/internal/redishub"
	goredis "github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire.lua
	acquireLua    string
	acquireScript = newScript(acquireLua)

	//go:embed release.lua
	releaseLua    string
	releaseScript = newScript(releaseLua)

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

	// MinReplicas, when above 0, makes a grant and every refresh count
	// only once WAIT reports that this many replicas have them (URL:
	// min_replicas=1): it narrows, and does not close, the window in
	// which a failover to a replica that lacks a lock grants it again.
	// A grant they do not acknowledge within MinReplicasTimeout is given
	// back (an error matching ErrReplicas); a refresh fails like one the
	// server did not answer, and the lease is lost at its ValidUntil
	// unless a later one succeeds. Costs one round trip per grant and per
	// refresh. Not with a Cluster client. Default 0: no waiting.
	MinReplicas int

	// MinReplicasTimeout bounds the wait for MinReplicas (URL:
	// min_replicas_timeout=100ms). Default DefaultMinReplicasTimeout.
	MinReplicasTimeout time.Duration
}

// New returns a Locker on the application's client. Closing the Locker does
// not close the client.
//
// The client must have ContextTimeoutEnabled set, or New fails with
// dlock.ErrInvalid: the Locker bounds every call with a context (a caller's
// deadline, a lease's validity), and without that option go-redis ignores
// context deadlines on reads, so a call to an unreachable server would block
// for ReadTimeout and its retries (12s and more with the defaults) whatever
// the ctx says. (Open sets it on the client it makes.)
//
// Supported clients:
//
//   - *goredis.Client, on one server or through Sentinel
//     (goredis.NewFailoverClient): the guarantees are those of the primary,
//     see Guarantees for what a failover does to them.
//   - *goredis.ClusterClient: a lock's keys share a hash slot (see Layout),
//     so every script runs on the primary of that slot; the release and
//     grant messages use PUBLISH, which a Redis Cluster delivers to every
//     node, so the Locker's one pub/sub connection hears them wherever it is.
//     The guarantees are those of that shard's primary.
//
// A *goredis.Ring is refused with dlock.ErrInvalid. A Ring is sharding on
// the client's side: each client hashes a key over the shards it currently
// believes alive, and drops a shard that misses its health checks. A lock
// then moves to another shard, where it is free, while its holder still
// holds it on the first one: two holders, without any server failing. Locks
// need every client to agree on where a name lives; use a Redis Cluster (or
// Redlock over independent servers) instead.
func New(client goredis.UniversalClient, opts *Options) (*dlock.Locker, error) {
	if err := redisclient.Check(client); err != nil {
		return nil, err
	}
	if opts != nil {
		if err := validateReplicas(opts, client); err != nil {
			return nil, err
		}
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
	d.hub = redishub.New(client, "redis", routeMessage)
	d.grants = d.prefix + "grants:" + newID()
	d.taken = d.prefix + "taken"
	if !d.compat {
		// The grant channel is this Locker's alone: the hub's probe that
		// its pub/sub connection is on the server the scripts run on (after
		// a failover). The compat layout subscribes no channel of its own
		// (an application's ACL may allow it none), and its waiters poll.
		d.hub.SetProbe(d.grants)
	}
	d.defaults = o.Defaults
	d.minReplicas, d.replicasTimeout = o.MinReplicas, o.MinReplicasTimeout
	if d.replicasTimeout == 0 {
		d.replicasTimeout = DefaultMinReplicasTimeout
	}
	d.replicasTimeout = max(d.replicasTimeout, time.Millisecond) // WAIT's 0 is forever
	d.syncKey = d.prefix + "sync:" + newID()
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
	taken      string // default layout: the prefix's steal channel (steal.lua)
	grants     string // default layout: this Locker's grant channel
	// held maps the tokens of the default layout's leases to their
	// handles, for the steal channel's listener (heardSteal), started once
	// (listenSteals).
	held         sync.Map
	listenSteals sync.Once
	bg           sync.WaitGroup // leaves still running after their Acquire returned

	minReplicas     int           // Options.MinReplicas
	replicasTimeout time.Duration // Options.MinReplicasTimeout or its default
	syncKey         string        // written before WAIT (replicas.go)
}

// newID returns 64 random bits, hex-encoded: a Locker's grant channel.
func newID() string {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

func (d *driver) Capabilities() dlock.Capabilities {
	return dlock.Capabilities{
		Fencing:       !d.compat,
		FIFO:          !d.compat,
		NotifiedWait:  true,
		MinTTL:        MinTTL,
		Semaphore:     !d.compat,
		PermitFencing: !d.compat,
		RWLock:        !d.compat,
		Metadata:      !d.compat,
		Steal:         true,
		StealNotified: !d.compat, // steal.lua publishes, handle.OnLost listens
		Records:       !d.compat, // record.go
	}
}

// keys returns the keys of name: in the compat layout just the lock key; in
// the default layout the lock, the fencing counter, the queue, the waiter
// entries and the holder's metadata, in the order the scripts take them.
func (d *driver) keys(name string) []string {
	return d.keysInto(make([]string, 0, 5), name)
}

// keysInto is keys appended to dst.
func (d *driver) keysInto(dst []string, name string) []string {
	if d.compat {
		return append(dst, d.prefix+name)
	}
	// One allocation for the five names, each a substring of it (the
	// acquire and release scripts take them on every call).
	lock := len(d.prefix) + len(name) + 2
	var b strings.Builder
	b.Grow(5*lock + len(":fence:queue:waiters:meta"))
	for _, suffix := range [...]string{"", ":fence", ":queue", ":waiters", ":meta"} {
		b.WriteString(d.prefix)
		b.WriteByte('{')
		b.WriteString(name)
		b.WriteByte('}')
		b.WriteString(suffix)
	}
	all := b.String()
	at := 0
	for _, n := range [...]int{0, len(":fence"), len(":queue"), len(":waiters"), len(":meta")} {
		dst = append(dst, all[at:at+lock+n])
		at += lock + n
	}
	return dst
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
	g, err := d.tryAcquire(ctx, req)
	return d.replicated(ctx, req.Name, g, err)
}

func (d *driver) tryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	if req.Kind != dlockdriver.KindLock {
		if d.compat {
			return nil, fmt.Errorf("%w: redis: the compat layout has no %s", errors.ErrUnsupported, req.Kind)
		}
		return d.tryKind(ctx, req, req.Wait)
	}
	// The handle is made first, holding the keys and the keys boxed that
	// the acquire script takes and, when granted, the lease keeps: one
	// allocation for them and the grant rather than four.
	h := d.newHandle(req.Name, req.Token)
	keys := h.keys
	if d.compat {
		px := millis(req.TTL)
		n, err := acquireScript.run(ctx, d.c, h.boxed, h.token, px).Int64()
		if err != nil {
			return nil, fmt.Errorf("redis: acquiring %q: %w", keys[0], err)
		}
		if n <= 0 {
			return nil, busy(n)
		}
		return h.granted(px, 0, false), nil
	}
	r, err := d.acquire(ctx, keys, h.boxed, h.token, req.TTL, 0, req.Metadata)
	if err != nil {
		return nil, err
	}
	if r.kind == replyBusy {
		return nil, busy(r.busy)
	}
	return h.granted(r.px, r.fence, req.Metadata != ""), nil
}

// newHandle returns the handle of a lock on name for token, not granted
// yet: its keys, and the keys boxed, are stored in it.
func (d *driver) newHandle(name, token string) *handle {
	h := &handle{d: d, token: token} // the token boxed once for every call of the lease
	h.keys = d.keysInto(h.keyArray[:0], name)
	for i, k := range h.keys {
		h.boxArray[i] = k
	}
	h.boxed = h.boxArray[:len(h.keys)]
	h.refreshKeys = h.keys[:1]
	return h
}

// granted is h's grant; meta: the lease stored metadata (default layout).
func (h *handle) granted(px int64, fence uint64, meta bool) *dlockdriver.Grant {
	if meta {
		h.meta, h.refreshKeys = true, []string{h.keys[0], h.keys[4]}
	}
	h.grant = dlockdriver.Grant{
		Handle: h,
		TTL:    time.Duration(px) * time.Millisecond,
		Fence:  fence,
	}
	return &h.grant
}

// grant is a lock's grant; boxed: keys boxed (nil: boxed here); meta: the
// lease stored metadata (default layout).
func (d *driver) grant(keys []string, boxed []any, token any, px int64, fence uint64, meta bool) *dlockdriver.Grant {
	if boxed == nil {
		boxed = boxKeys(keys)
	}
	h := &handle{d: d, keys: keys, boxed: boxed, token: token, refreshKeys: keys[:1]}
	return h.granted(px, fence, meta)
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
	if req.Kind != dlockdriver.KindLock {
		return d.abandonKind(ctx, req, "")
	}
	keys := d.keys(req.Name)
	if err := d.release(ctx, keys, nil, req.Token, req.Metadata != "" && !d.compat).Err(); err != nil {
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

// routeMessage gives a grant message, "g:<token>:<fence>" (a lock handed
// by the queue scripts to the waiter of that token), to that waiter alone.
// A steal message, "t:<token>" (steal.lua), goes to the steal channel's one
// listener (driver.listenSteals).
func routeMessage(payload string) (string, bool) {
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

// release runs release.lua for token; boxed: keys boxed (nil: boxed here);
// meta: the lease (or the wait) has metadata.
func (d *driver) release(ctx context.Context, keys []string, boxed []any, token any, meta bool) *goredis.Cmd {
	if boxed == nil {
		boxed = boxKeys(keys)
	}
	if meta {
		return releaseScript.run(ctx, d.c, boxed, token, "m")
	}
	return releaseScript.run(ctx, d.c, boxed, token)
}

// boxKeys returns keys as the any values a command's arguments are, boxed
// once for every call of a lease rather than by go-redis at each call (a
// string boxed is an allocation).
func boxKeys(keys []string) []any {
	b := make([]any, len(keys))
	for i, k := range keys {
		b[i] = k
	}
	return b
}

// script is a Lua script with its hash, boxed once.
type script struct {
	*goredis.Script
	sha, src any
}

func newScript(src string) *script {
	s := goredis.NewScript(src)
	return &script{Script: s, sha: s.Hash(), src: src}
}

// run is goredis.Script.Run (EVALSHA, then EVAL when the server does not
// have the script) on keys already boxed: one allocation for the arguments
// rather than one per key and per string.
func (s *script) run(ctx context.Context, c goredis.UniversalClient, keys []any, args ...any) *goredis.Cmd {
	a := make([]any, 3, 3+len(keys)+len(args))
	a[0], a[1], a[2] = "evalsha", s.sha, len(keys)
	a = append(append(a, keys...), args...)
	cmd := goredis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	_ = c.Process(ctx, cmd)
	if err := cmd.Err(); errors.Is(err, goredis.ErrNoScript) || goredis.HasErrorPrefix(err, "NOSCRIPT") {
		a = slices.Clone(a)
		a[0], a[1] = "eval", s.src
		cmd = goredis.NewCmd(ctx, a...)
		cmd.SetFirstKeyPos(3)
		_ = c.Process(ctx, cmd)
	}
	return cmd
}

// handle is one held lease: its keys and token.
type handle struct {
	d           *driver
	keys        []string // the layout's keys, lock key first
	boxed       []any    // keys, boxed
	token       any      // the lease token, a string
	meta        bool     // the lease stored metadata (default layout)
	refreshKeys []string // the lock key, and the metadata key when meta

	// Storage for keys and boxed (newHandle), and the grant returned for
	// the handle, so that they cost no allocation of their own.
	keyArray [5]string
	boxArray [5]any
	grant    dlockdriver.Grant

	// onLost is the Locker's loss callback (OnLost), called once a steal
	// of the lock is heard; takenOver says that it was.
	onLost    func()
	takenOver atomic.Bool
}

// OnLost implements dlockdriver.LossNotifier in the default layout: the
// handle is registered by its token with the driver, whose one listener on
// the prefix's steal channel (listenSteals: one subscription per Locker,
// made at its first lease, kept until Close) calls f when steal.lua
// publishes the token. A lease costs a map store and delete, no round
// trip. Nothing else is reported this way: a lock that expired or was
// deleted is found by the next refresh, as before.
func (h *handle) OnLost(f func()) {
	if h.d.compat {
		return
	}
	h.onLost = f
	h.d.held.Store(h.token.(string), h)
	h.d.listenSteals.Do(func() {
		// A hub that cannot listen (closed) leaves the refresh to find a
		// steal.
		_, _ = h.d.hub.Listen(h.d.taken, "", h.d.heardSteal)
	})
}

// heardSteal is the steal channel's listener: it ends the lease whose token
// a steal message names. Called under the hub's lock, so the callback runs
// outside it. A reconnection (message false) tells nothing of a steal.
func (d *driver) heardSteal(payload string, message bool) {
	token, ok := strings.CutPrefix(payload, "t:")
	if !message || !ok {
		return
	}
	if v, ok := d.held.LoadAndDelete(token); ok {
		h := v.(*handle)
		if h.takenOver.CompareAndSwap(false, true) {
			go h.onLost()
		}
	}
}

// LossCause implements dlockdriver.LossCauser: ErrTakenOver when the
// handle heard its lock stolen.
func (h *handle) LossCause() error {
	if h.takenOver.Load() {
		return fmt.Errorf("%w: redis: %q was taken over (Locker.Steal)", dlock.ErrTakenOver, h.keys[0])
	}
	return nil
}

// stopListening forgets the handle's token: a steal is no longer its news.
func (h *handle) stopListening() {
	if h.onLost != nil {
		h.d.held.CompareAndDelete(h.token.(string), h)
	}
}

func (h *handle) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	px := millis(ttl)
	n, err := refreshScript.Run(ctx, h.d.c, h.refreshKeys, h.token, px).Int64()
	if err != nil {
		return 0, fmt.Errorf("redis: refreshing %q: %w", h.keys[0], err)
	}
	if n == 0 {
		h.stopListening()
		return 0, fmt.Errorf("%w: redis: %q does not hold this lease's token", dlock.ErrNotHeld, h.keys[0])
	}
	if n < 0 {
		h.stopListening()
		return 0, fmt.Errorf("%w: redis: %q holds another lease's token", dlock.ErrTakenOver, h.keys[0])
	}
	if err := h.d.syncReplicas(ctx); err != nil {
		return 0, fmt.Errorf("redis: refreshing %q: %w", h.keys[0], err)
	}
	return time.Duration(px) * time.Millisecond, nil
}

func (h *handle) Release(ctx context.Context) error {
	h.stopListening()
	n, err := h.d.release(ctx, h.keys, h.boxed, h.token, h.meta).Int64()
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
