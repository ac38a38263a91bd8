package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// MinTTL is the shortest TTL the driver accepts: a lease's session must
	// be able to run its refreshes well within idle_session_timeout, and a
	// grant must arrive within its TTL, on a busy machine too. At 100ms the
	// conformance suite lost leases and had grants come back expired on a
	// 2-core machine with two busy loops beside it (load ~8); 500ms holds.
	MinTTL = 500 * time.Millisecond
	// MaxTTL is the longest: idle_session_timeout's limit (2^31-1 ms).
	MaxTTL = math.MaxInt32 * time.Millisecond
	// ExpirySlack is how long past its TTL (counted, as ValidUntil is, from
	// when the last statement was sent) the server may still hold a lock
	// whose holder went silent: the statement's way to the server, plus the
	// server ending the session.
	ExpirySlack = 100 * time.Millisecond
)

const (
	// cancelGrace bounds how long a statement may run on after its ctx
	// ended and a cancel request went out before its connection is closed.
	cancelGrace = time.Second
	// cancelGraceEnding is cancelGrace for a statement whose session ends
	// anyway once a cancel was sent (cancellableEnding): a wait cut short
	// by its ctx returns this soon after it, not a second later, when the
	// server does not answer. It is not shorter because a wait given up
	// before the server has cancelled it stays in the lock's queue until
	// the server notices the closed connection: a lock released meanwhile
	// goes to that dead session for a moment. At 150ms, on a loaded
	// machine, a TryAcquire right after such a release found the lock held
	// (CancelDuringWait, busy run 22).
	cancelGraceEnding = 400 * time.Millisecond
	// cancelRetry is how often the cancel request is repeated while the
	// statement runs on (a request that reached the server before the
	// statement did is ignored there).
	cancelRetry = 100 * time.Millisecond
	// watchDelay is how long a lease's connection must have been idle
	// before it is watched for the server ending the session; shorter leases
	// skip the watch's cost. It is also how long a released lease's
	// connection may stay parked (see driver.park).
	watchDelay = 50 * time.Millisecond
	// parkMinTTL is the shortest idle_session_timeout a released lease's
	// session may have for its connection to be parked: far longer than a
	// parked connection stays idle (two watchDelays at most, and the
	// statement that restores its settings).
	parkMinTTL = time.Second
	// expiryGrace is how long after its server-side expiry a lease's
	// connection is given up when the server's word that it ended the
	// session has not come (a partition).
	expiryGrace = time.Second
	// closeTimeout bounds closing a connection (the Terminate message).
	closeTimeout = time.Second
	// retryMin and retryMax bound the backoff of a wait whose connection
	// failed (a server restart, say).
	retryMin = 10 * time.Millisecond
	retryMax = time.Second
)

// ErrPooler reports a connection through a transaction pooler, or through
// any proxy when Options.SessionPooler is not set: the backend that ran a
// statement is not the one the connection started with, so a session lock
// could be taken on one backend and checked, refreshed or released on
// another. Errors wrapping it also match dlock.ErrNotAcquired (at
// acquisition) or dlock.ErrNotHeld (during a lease).
var ErrPooler = errors.New("postgres: the connection goes through a transaction pooler or proxy (session advisory locks need a session of their own: connect to the server directly, or through a session-mode pooler with Options.SessionPooler)")

// Options configure a Locker. A nil *Options means all defaults.
type Options struct {
	// Defaults are the Locker's default lock options (URL: ttl, refresh,
	// refresh_interval, retry_min, retry_max, metadata). Zero fields mean the
	// defaults documented on dlock.Options.
	Defaults dlock.Options

	// KeyPrefix is put before every lock name before hashing it into an
	// advisory key (URL: prefix=app/), to keep apart applications that lock
	// the same names on one database. Default "".
	KeyPrefix string

	// NoFencing turns fencing tokens off (URL: fencing=false): an acquisition
	// then takes no nextval, and the driver needs no sequence or table.
	// Default false.
	NoFencing bool

	// FenceSchema is the schema of the fencing sequence and epoch table
	// (URL: fence_schema=locks). Every Locker that fences locks of one
	// database must use the same one: tokens from different sequences are
	// not ordered. Default DefaultFenceSchema ("public").
	FenceSchema string

	// SessionPooler allows a proxy between the driver and the server, such as
	// PgBouncer in pool_mode=session, whose backend pid differs from the one
	// the connection announced (URL: session_pooler=true). The pid is still
	// checked on every statement of a lease, so a transaction pooler that
	// moves a lease's statements to another backend is found out then (and
	// the lease lost), but not before: never set it for a transaction pooler.
	// Default false: any proxy is refused with ErrPooler.
	SessionPooler bool

	// SharedSessions stacks the advisory locks of every lease on a few
	// shared sessions (URL: shared_sessions=true), and makes SharedMinTTL
	// the shortest TTL; see DESIGN.md, Shared sessions. It applies to locks
	// without metadata; semaphores, read/write locks and locks with
	// metadata keep a connection each. Default false: a lock takes a
	// connection of its own while the Locker's locks hold fewer than half
	// of the pool's MaxConns (or its TTL is under SharedMinTTL), and shares
	// a session past them, so that a Locker holds thousands of leases on a
	// pool of a few connections.
	SharedSessions bool

	// NoSharedSessions gives every lease a connection of its own (URL:
	// shared_sessions=false): a Locker then holds at most the pool's
	// MaxConns leases and waiting Acquires at once, and fails past them
	// with dlock.ErrResourceLimit. Default false; not with SharedSessions.
	NoSharedSessions bool

	// SharedConns is the most shared sessions per TTL (URL: shared_conns).
	// Default DefaultSharedConns (4).
	SharedConns int

	// WaitConns bounds the connections of waiting Acquires with
	// SharedSessions (URL: wait_conns): an Acquire that finds its lock busy
	// waits on one of its own, and keeps it for the lease it is granted;
	// past the bound it fails at once with dlock.ErrResourceLimit. Default
	// DefaultWaitConns (16).
	WaitConns int
}

// New returns a Locker taking its connections from the application's pool.
// Closing the Locker does not close the pool.
func New(pool *pgxpool.Pool, opts *Options) (*dlock.Locker, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres: nil pool", dlock.ErrInvalid)
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	d := newDriver(pool, opts, false)
	return dlock.New(d.api(), &d.defaults)
}

// check rejects options that contradict each other.
func (o *Options) check() error {
	if o != nil && o.SharedSessions && o.NoSharedSessions {
		return fmt.Errorf("%w: postgres: SharedSessions and NoSharedSessions are both set", dlock.ErrInvalid)
	}
	return nil
}

// api is the driver as the Locker sees it: with shared sessions, one that
// refreshes leases in batches.
func (d *driver) api() dlockdriver.Driver {
	if d.shared != nil {
		return sharedDriver{d}
	}
	return d
}

// NewFromConfig makes a pool from cfg, checks that the server answers
// (bounded by ctx), and returns a Locker that owns the pool and closes it on
// Close. It is the owning path for a configuration adjusted after ParseURL
// (a TLS config, pgx hooks): every lease and waiting Acquire holds one of the
// pool's connections for its whole life, so a pool of the Locker's own keeps
// locks from starving the application's queries, and the other way round.
func NewFromConfig(ctx context.Context, cfg *pgxpool.Config, opts *Options) (*dlock.Locker, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: postgres: nil config", dlock.ErrInvalid)
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg) // connects lazily
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	d := newDriver(pool, opts, true)
	l, err := dlock.New(d.api(), &d.defaults)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if err := d.Ping(ctx); err != nil {
		_ = l.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return l, nil
}

// Ping connects, and when fencing is on makes or checks the fencing objects,
// so that a Locker fails when it is opened rather than at its first
// acquisition. ctx bounds it.
func (d *driver) Ping(ctx context.Context) error {
	where := ""
	if d.addr != "" {
		where = " to " + d.addr
	}
	if err := d.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: connecting%s: %w", where, err)
	}
	if d.fencing {
		err := d.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
			return d.ensureEpoch(ctx, c.Conn())
		})
		if err != nil {
			return fmt.Errorf("postgres: opening%s: %w", where, err)
		}
	}
	return nil
}

func newDriver(pool *pgxpool.Pool, opts *Options, ownsPool bool) *driver {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.FenceSchema == "" {
		o.FenceSchema = DefaultFenceSchema
	}
	d := &driver{
		pool:     pool,
		ownsPool: ownsPool,
		prefix:   o.KeyPrefix,
		fencing:  !o.NoFencing,
		fence:    newFenceObjects(o.FenceSchema),
		checkPID: !o.SessionPooler,
		leases:   make(map[*lease]struct{}),
		closing:  make(chan struct{}),
	}
	d.maxParked = int(pool.Config().MaxConns) / 4
	fence := "0::int8"
	if d.fencing {
		fence = "nextval(" + d.fence.seqLit + ")"
	}
	acquire := func(take, prev string) *stmt {
		return newAcquireStmt(acquireStatement(lockKey, take, prev, fence))
	}
	d.waitStmt, d.waitKept = acquire(waitTake, prevSettings), acquire(waitTakeKept, prevKept)
	d.tryStmt, d.tryKept = acquire(tryTake, prevSettings), acquire(tryTakeKept, prevKept)
	d.acquireAll = acquireAllStatement(fence)
	d.kinds = newKindStmts(fence)
	if d.fencing {
		d.meta = newMetadataStmts(d.fence)
	}
	d.defaults = o.Defaults
	if !o.NoSharedSessions {
		d.shared = newSharedSet(d, o.SharedConns, o.WaitConns)
		if !o.SharedSessions {
			d.own = make(chan struct{}, pool.Config().MaxConns/2)
		}
	}
	return d
}

type driver struct {
	pool     *pgxpool.Pool
	ownsPool bool
	defaults dlock.Options // New's Options.Defaults
	addr     string        // the redacted URL, when opened from one
	prefix   string
	fencing  bool
	fence    fenceObjects
	checkPID bool // the backend pid must be the one of the startup message

	// acquire.sql, with the fencing expression in place: waiting or trying
	// once, setting the session up or (Kept) finding it set up already
	waitStmt, waitKept, tryStmt, tryKept *stmt
	maxParked                            int // see park
	// acquire_all.sql with the fencing expression in place (all.go)
	acquireAll string
	// the statements of the other kinds (kinds.go), by Kind
	kinds [dlockdriver.KindWrite + 1]*kindStmts
	meta  *metadataStmts // nil without fencing (metadata.go)
	// shared is nil with Options.NoSharedSessions (shared.go)
	shared *sharedSet
	// own has a place for each lock that may take a connection of its own
	// before locks share sessions (half the pool's MaxConns); nil with
	// Options.SharedSessions or NoSharedSessions
	own chan struct{}

	mu       sync.Mutex
	closed   bool
	closing  chan struct{}       // closed by Close
	leases   map[*lease]struct{} // holding a connection
	parked   []parked            // in the order parked; unpark takes the last
	parking  int                 // connections of releases that will park them
	sweeping bool                // sweep runs
	wg       sync.WaitGroup      // sweep and the connection watchers
}

func (d *driver) Capabilities() dlock.Capabilities {
	return dlock.Capabilities{
		Fencing:      d.fencing,
		FIFO:         true,
		NotifiedWait: true,
		MinTTL:       MinTTL,
		ExpirySlack:  ExpirySlack,
		// The session holds the lock: a connection reset ends both.
		ConnectionBound: true,
		// Metadata lives in a table of the fencing schema (metadata.go).
		Metadata:      d.fencing,
		Semaphore:     true,
		PermitFencing: d.fencing,
		RWLock:        true,

		// Records (record.go), whose commits are flushed (record.sql).
		Records:        true,
		DurableRecords: true,
	}
}

// millis is ttl as idle_session_timeout, in whole milliseconds rounded up (a
// TTL must never be shortened).
func millis(ttl time.Duration) (string, error) {
	if ttl > MaxTTL {
		return "", fmt.Errorf("%w: TTL %v is above PostgreSQL's idle_session_timeout limit of %v", dlock.ErrInvalid, ttl, MaxTTL)
	}
	return strconv.FormatInt(int64((ttl+time.Millisecond-1)/time.Millisecond), 10), nil
}

// Close gives up the connections of leases that ended without a release
// (the Locker released the others), waits for their watchers, and closes the
// pool if the driver made it.
func (d *driver) Close() error {
	d.mu.Lock()
	if !d.closed {
		close(d.closing)
	}
	d.closed = true
	leases := make([]*lease, 0, len(d.leases))
	for h := range d.leases {
		leases = append(leases, h)
	}
	parked := d.parked
	d.parked = nil
	d.mu.Unlock()
	for _, h := range leases {
		h.giveUp()
	}
	if d.shared != nil {
		d.shared.close()
	}
	for _, p := range parked {
		discard(p.c) // nothing to keep: no lock, no setting worth a statement
	}
	d.wg.Wait()
	if d.ownsPool {
		d.pool.Close()
	}
	return nil
}

// discard closes a pooled connection and hands it back, so that the pool
// drops it: its session, and whatever it holds or waits for, ends.
func discard(c *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = c.Conn().Close(ctx)
	c.Release()
}
