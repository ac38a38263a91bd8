package postgres

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	//go:embed acquire.sql
	acquireFile string
	//go:embed refresh.sql
	refreshFile string
	//go:embed held.sql
	heldFile string
	//go:embed release.sql
	releaseFile string

	acquireSQL = statement("acquire.sql", acquireFile)
	refreshSQL = statement("refresh.sql", refreshFile)
	heldSQL    = heldStatement(lockMatch)
	releaseSQL = statement("release.sql", releaseFile)
)

// statement is the SQL of a .sql file as it goes to the server: its comment
// lines (which document it here) replaced by a tag naming the file, so that
// pg_stat_activity shows an operator the statement (it keeps the first
// track_activity_query_size bytes of a query, 1024 by default, fewer than
// the comments).
func statement(file, text string) string {
	var b strings.Builder
	b.WriteString("/* dlock: " + file + " */")
	for line := range strings.Lines(text) {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "--") {
			b.WriteString("\n" + strings.TrimRight(line, "\n"))
		}
	}
	return b.String()
}

// The {{take}} clauses of acquire.sql. Acquire sets the session up before it
// queues, so that nothing but the fencing token is left to do once the lock
// is granted; TryAcquire sets it up only once granted, so that a busy lock
// leaves the session as it was. The ...Kept variants run on a connection kept
// from a lease of the same TTL, set up already (see driver.park).
const (
	setUp = `WHEN set_config('idle_session_timeout', $3, false) IS NULL THEN NULL
            WHEN set_config('synchronous_commit', 'off', false) IS NULL THEN NULL`
	waitTake     = setUp + "\n            " + waitTakeKept
	waitTakeKept = `WHEN pg_advisory_lock(hashtextextended($1, 0)) IS NOT NULL THEN {{fence}}`
	tryTake      = `WHEN pg_try_advisory_lock(hashtextextended($1, 0)) THEN
              CASE ` + setUp + ` ELSE {{fence}} END`
	tryTakeKept = `WHEN pg_try_advisory_lock(hashtextextended($1, 0)) THEN {{fence}}`
)

// The {{prev}} columns of acquire.sql.
const (
	prevSettings = `current_setting('idle_session_timeout') AS prev_idle,
       current_setting('synchronous_commit') AS prev_sync,`
	prevKept = `NULL::text AS prev_idle, NULL::text AS prev_sync,`
)

// The {{restore}} clauses of release.sql.
const (
	restore     = `set_config('idle_session_timeout', $3, false) IS NOT NULL AND set_config('synchronous_commit', $4, false) IS NOT NULL`
	restoreKept = `true`
)

const (
	// MinTTL is the shortest TTL the driver accepts: a lease's session must
	// be able to run its refreshes well within idle_session_timeout.
	MinTTL = 100 * time.Millisecond
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

	// SharedSessions stacks the advisory locks of many leases on a few
	// shared sessions instead of a connection per lease (URL:
	// shared_sessions=true); see the package doc, Shared sessions. It
	// applies to locks without metadata; semaphores, read/write locks and
	// locks with metadata keep a connection each. Default false.
	SharedSessions bool

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
	d := newDriver(pool, opts, false)
	return dlock.New(d.api(), &d.defaults)
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
	d.kinds = newKindStmts(fence)
	if d.fencing {
		d.meta = newMetadataStmts(d.fence)
	}
	d.defaults = o.Defaults
	if o.SharedSessions {
		d.shared = newSharedSet(d, o.SharedConns, o.WaitConns)
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
	// the statements of the other kinds (kinds.go), by Kind
	kinds [dlockdriver.KindWrite + 1]*kindStmts
	meta  *metadataStmts // nil without fencing (metadata.go)
	// shared is nil unless Options.SharedSessions (shared.go)
	shared *sharedSet

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

// deadConnRetries is how many times TryAcquire replaces a pooled connection
// that turns out dead.
const deadConnRetries = 3

// TryAcquire makes one pg_try_advisory_lock attempt (acquire.sql, one round
// trip). A pooled connection that turns out dead (the server restarted since
// the pool last used it) is replaced, up to deadConnRetries times: its
// session is gone, and with it anything the statement might have taken.
func (d *driver) TryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	ms, err := millis(req.TTL)
	if err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		g, err := d.acquire(ctx, req, ms, false)
		if err == nil || i == deadConnRetries || ctx.Err() != nil || !isConnError(err) {
			return g, err
		}
	}
}

// Acquire waits in the server's lock queue (pg_advisory_lock). When its
// connection fails (a restart, a dropped connection) it queues again on
// another after a backoff, until ctx ends.
func (d *driver) Acquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	ms, err := millis(req.TTL)
	if err != nil {
		return nil, err
	}
	retry := backoff.Backoff{Min: retryMin, Max: retryMax}
	var timer *time.Timer
	for {
		g, err := d.acquire(ctx, req, ms, true)
		if err == nil || ctx.Err() != nil || !retryable(err) {
			return g, err
		}
		delay := retry.Next()
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w (after: %w)", dlock.ErrNotAcquired, ctx.Err(), err)
		case <-timer.C:
		}
	}
}

func newAcquireStmt(sql string) *stmt {
	return newStmt(sql, []uint32{oidText, oidInt4, oidText}, []uint32{oidInt4, oidText, oidText, oidInt8, oidFloat8, oidInt8})
}

// releaseStmt is release.sql, restoring the session's settings;
// releaseKept leaves them for the connection to be parked.
var (
	releaseStmt = newReleaseStmt(restore)
	releaseKept = newReleaseStmt(restoreKept)
)

func newReleaseStmt(restore string) *stmt {
	return newReleaseStmtOf(lockUnlock, restore)
}

// newReleaseStmtOf is release.sql with unlock, the unlock of the object's
// key, and restore in place.
func newReleaseStmtOf(unlock, restore string) *stmt {
	sql := strings.ReplaceAll(releaseSQL, "{{unlock}}", unlock)
	return newStmt(strings.ReplaceAll(sql, "{{restore}}", restore), []uint32{oidInt4, oidText, oidText, oidText}, []uint32{oidBool})
}

// acquireStatement is acquire.sql with key, the advisory key of the object
// taken, take and prev in place, and fence in take.
func acquireStatement(key, take, prev, fence string) string {
	sql := strings.ReplaceAll(acquireSQL, "{{take}}", strings.ReplaceAll(take, "{{fence}}", fence))
	sql = strings.ReplaceAll(sql, "{{key}}", key)
	return strings.ReplaceAll(sql, "{{prev}}", prev)
}

// acquireRow is acquire.sql's result.
type acquireRow struct {
	pid      int32
	fence    int64 // see acquire.sql: -1, or the grant's token (when not null)
	pidCheck bool  // fence was not NULL: the statement ran on the expected backend
	waited   float64
	// release holds release.sql's parameters: the pid, the key text, and
	// the settings to restore (the pid and prev_ values as they came, in
	// one buffer; those of a parked connection are its own).
	release [4][]byte
	key     []byte // the lock's int8 key as it came (fastUnlock's argument)
}

func (r *acquireRow) decode(v [][]byte) (err error) {
	if r.pid, err = decodeInt4(v[0]); err != nil {
		return err
	}
	if r.pidCheck = v[3] != nil; r.pidCheck {
		if r.fence, err = decodeInt8(v[3]); err != nil {
			return err
		}
	}
	if r.waited, err = decodeFloat8(v[4]); err != nil {
		return err
	}
	if _, err := decodeInt8(v[5]); err != nil { // the key, kept in binary
		return err
	}
	buf := make([]byte, 0, len(v[5])+len(v[0])+len(v[1])+len(v[2]))
	buf = append(buf, v[5]...)
	k := len(buf)
	buf = append(buf, v[0]...)
	n := len(buf)
	buf = append(buf, v[1]...)
	m := len(buf)
	buf = append(buf, v[2]...)
	r.key = buf[:k:k]
	r.release[0], r.release[2], r.release[3] = buf[k:n:n], buf[n:m:m], buf[m:]
	return nil
}

// acquire makes one attempt: on a shared session (shared.go), or on a
// connection of its own (acquireConn).
func (d *driver) acquire(ctx context.Context, req dlockdriver.Request, ms string, wait bool) (*dlockdriver.Grant, error) {
	if d.shared != nil && req.Kind == dlockdriver.KindLock && (req.Metadata == "" || d.meta == nil) {
		return d.shared.acquire(ctx, req, ms, wait)
	}
	return d.acquireConn(ctx, req, ms, wait)
}

// acquireConn makes one attempt on a connection from the pool: one
// pg_try_advisory_lock, or one wait in pg_advisory_lock.
func (d *driver) acquireConn(ctx context.Context, req dlockdriver.Request, ms string, wait bool) (*dlockdriver.Grant, error) {
	// A lock may take a parked connection; the other kinds take theirs from
	// the pool (kinds.go).
	var ks *kindStmts
	var kept parked
	ok := false
	if req.Kind == dlockdriver.KindLock {
		kept, ok = d.unpark()
	} else if ks = d.kinds[req.Kind]; req.Kind == dlockdriver.KindPermit {
		return d.acquirePermit(ctx, req, ms, wait, ks)
	}
	c := kept.c
	if !ok {
		var err error
		if c, err = d.conn(ctx); err != nil {
			return nil, err
		}
	} else if err := d.ensureEpochOf(ctx, c); err != nil {
		return nil, err
	}
	pg := c.Conn().PgConn()
	var pid int32
	if d.checkPID {
		pid = int32(pg.PID())
	}
	// The lease is made first: the row is decoded into it.
	h := &lease{d: d, c: c, pg: pg, name: req.Name, ttl: req.TTL, ms: ms, kind: req.Kind, ks: ks}
	waitStmt, tryStmt := d.waitStmt, d.tryStmt
	if ks != nil {
		waitStmt, tryStmt = ks.wait, ks.try
	} else if ok && kept.ms == ms {
		waitStmt, tryStmt = d.waitKept, d.tryKept
	}
	r := &h.acquireRow
	buf := make([]byte, 0, len(d.prefix)+len(req.Name)+4+len(ms))
	buf = append(append(buf, d.prefix...), req.Name...)
	buf = binary.BigEndian.AppendUint32(buf, uint32(pid))
	buf = append(buf, ms...)
	n := len(d.prefix) + len(req.Name)
	h.args = [3][]byte{buf[:n:n], buf[n : n+4 : n+4], buf[n+4:]}
	r.release[1] = h.args[0]
	sent := time.Now()
	var err error
	if wait {
		var cancelled bool
		cancelled, err = h.cw.cancellable(ctx, pg, 0, func() error {
			return waitStmt.run(context.Background(), c.Conn(), h.args[:], r)
		})
		if err == nil && cancelled {
			// Granted as the wait was cancelled: closing the session gives
			// the lock back.
			discard(c)
			return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
		}
	} else {
		err = tryStmt.run(ctx, c.Conn(), h.args[:], r)
	}
	recv := time.Now()
	if err != nil {
		// The statement may have taken the lock before it failed (a
		// cancel, a broken connection): the session must end.
		if pg.IsClosed() {
			err = &connError{err}
		}
		discard(c)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
		}
		return nil, fmt.Errorf("postgres: acquiring %q: %w", req.Name, err)
	}
	switch {
	case !r.pidCheck:
		discard(c)
		return nil, fmt.Errorf("%w: %w: connection started as backend %d, statement ran on backend %d", dlock.ErrNotAcquired, ErrPooler, pg.PID(), r.pid)
	case r.fence < 0: // nothing changed on the session
		if ok {
			d.repark(kept)
		} else {
			c.Release()
		}
		return nil, dlockdriver.Busy(0)
	}
	if ok {
		r.release[2], r.release[3] = kept.orig[0], kept.orig[1]
	}
	var fence uint64
	if d.fencing && req.Kind != dlockdriver.KindRead {
		if r.fence <= 0 {
			discard(c)
			return nil, fmt.Errorf("postgres: acquiring %q: no fencing token", req.Name)
		}
		fence = uint64(r.fence)
	}
	if wait {
		// The TTL runs from the grant, which the server timed: sent plus the
		// time the statement waited, which cannot exceed what the client saw.
		w := time.Duration(r.waited * float64(time.Second))
		sent = sent.Add(max(0, min(w, recv.Sub(sent))))
	}
	if req.Metadata != "" && d.meta != nil && req.Kind == dlockdriver.KindLock {
		if err := d.storeMetadata(ctx, h, fence, req.Metadata); err != nil {
			discard(c)
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
			}
			return nil, fmt.Errorf("postgres: acquiring %q: storing its metadata: %w", req.Name, err)
		}
		h.meta = true
	}
	h.lastSent, h.idle = sent, recv
	if !d.track(h) {
		h.giveUp()
		return nil, dlock.ErrClosed
	}
	// Loss is reported through OnLost (dlockdriver.LossNotifier) alone.
	return &dlockdriver.Grant{Handle: h, Fence: fence, Sent: sent}, nil
}

// poolWait is how long an acquisition waits for a connection when the pool
// has none free before it fails with dlock.ErrResourceLimit.
const poolWait = time.Second

// conn takes a connection from the pool for an acquisition, its fencing
// epoch checked.
func (d *driver) conn(ctx context.Context) (*pgxpool.Conn, error) {
	// Every lease and wait holds a connection of its own: when the pool
	// has none free, wait only as long as another user's short request
	// takes, then say which limit is reached rather than wait on.
	actx := ctx
	if st := d.pool.Stat(); st.AcquiredConns() >= st.MaxConns() {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, poolWait)
		defer cancel()
	}
	c, err := d.pool.Acquire(actx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
		}
		if actx.Err() != nil {
			holders := "each lease and each wait holds one"
			if d.shared != nil {
				holders = "each shared session, each wait, and each permit, read/write lock or lease with metadata holds one"
			}
			return nil, fmt.Errorf("%w: postgres: all %d connections of the pool are in use (%s): raise pool_max_conns, within the server's max_connections",
				dlock.ErrResourceLimit, d.pool.Config().MaxConns, holders)
		}
		return nil, fmt.Errorf("postgres: getting a connection: %w", err)
	}
	if err := d.ensureEpochOf(ctx, c); err != nil {
		return nil, err
	}
	return c, nil
}

// ensureEpochOf is ensureEpoch for an acquisition, when fencing is on: on
// failure the connection is discarded.
func (d *driver) ensureEpochOf(ctx context.Context, c *pgxpool.Conn) error {
	if !d.fencing {
		return nil
	}
	err := d.ensureEpoch(ctx, c.Conn())
	if err == nil {
		return nil
	}
	if c.Conn().PgConn().IsClosed() {
		err = &connError{err}
	}
	discard(c)
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", dlock.ErrNotAcquired, ctx.Err())
	}
	return err
}

// track registers a lease holding a connection, starting the sweep if it is
// not running; false once the driver is closed.
func (d *driver) track(h *lease) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.leases[h] = struct{}{}
	d.startSweep()
	return true
}

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
	h.freeWaitSlot()
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
	h.freeWaitSlot()
	d.mu.Lock()
	delete(d.leases, h)
	d.mu.Unlock()
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

// cancellable runs q, a statement on pg, with a context that never ends
// (so pgx neither watches it nor closes the connection for it), while ctx
// bounds it through the server: when ctx ends first, cancel requests ask the
// server to stop the statement, which then fails with query_canceled and
// leaves the session (and any lock it holds) alone. Only when the statement
// still runs cancelGrace later (the server is unreachable), or after limit
// (when not zero), does the connection get a deadline in the past: the
// statement fails and pgx closes the connection. cancellable waits for its
// cancel requests to finish; it reports whether it sent any. w is the
// lease's: its statements run one at a time.
func (w *cancelWatch) cancellable(ctx context.Context, pg *pgconn.PgConn, limit time.Duration, q func() error) (cancelled bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	conn := pg.Conn()
	if limit > 0 {
		_ = conn.SetDeadline(time.Now().Add(limit))
	}
	gaveUp := false
	if ctx.Done() == nil {
		err = q()
	} else {
		if w.fire == nil {
			w.fire = w.watch
		}
		w.ctx, w.pg = ctx, pg
		w.wg.Add(1)
		stop := context.AfterFunc(ctx, w.fire)
		err = q()
		if stop() {
			w.wg.Done() // w.watch will not run
		} else {
			w.mu.Lock()
			w.finished = true
			if w.done != nil {
				close(w.done)
			}
			w.mu.Unlock()
			w.wg.Wait()
		}
		cancelled, gaveUp = w.cancelled, w.gaveUp
		*w = cancelWatch{fire: w.fire}
	}
	if (limit != 0 || gaveUp) && !pg.IsClosed() {
		_ = conn.SetDeadline(time.Time{})
	}
	return cancelled, err
}

// cancelWatch is the state of one cancellable statement, in the lease (no
// allocation per statement but the AfterFunc's own).
type cancelWatch struct {
	fire      func() // watch, bound once
	ctx       context.Context
	pg        *pgconn.PgConn
	wg        sync.WaitGroup // watch, when it runs
	mu        sync.Mutex
	finished  bool          // the statement returned
	done      chan struct{} // made by watch, closed when the statement returns
	cancelled bool          // watch sent cancel requests
	gaveUp    bool          // watch set a deadline in the past
}

// watch runs when the statement's ctx ends first: it sends cancel requests
// until the statement returns, or gives the connection up cancelGrace later.
func (w *cancelWatch) watch() {
	defer w.wg.Done()
	w.mu.Lock()
	if w.finished {
		w.mu.Unlock()
		return
	}
	w.cancelled = true
	w.done = make(chan struct{})
	done := w.done
	w.mu.Unlock()
	// A request under way is let finish even once the statement returned,
	// so that none reaches the server later and cancels the next statement.
	gctx, gcancel := context.WithTimeout(context.WithoutCancel(w.ctx), cancelGrace)
	defer gcancel()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-gctx.Done():
			// The server did not answer: give the connection up.
			_ = w.pg.Conn().SetDeadline(time.Now())
			w.gaveUp = true // reset by cancellable if the statement succeeded nonetheless
			return
		case <-t.C:
			_ = w.pg.CancelRequest(gctx)
			t.Reset(cancelRetry)
		}
	}
}

// connError marks the failure of a statement whose connection ended: its
// session is gone, and with it anything the statement may have done.
type connError struct{ err error }

func (e *connError) Error() string { return e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

func isConnError(err error) bool {
	var ce *connError
	return errors.As(err, &ce)
}

// retryable reports an error after which a wait starts again: a connection
// that ended or could not be made (a server restarting), a server starting up
// or shutting down, too many connections, a statement cancelled by someone
// else or by statement_timeout. Authentication and configuration errors are
// not.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code[:min(2, len(pe.Code))] {
		case "08", "53", "57":
			return true
		}
		return false
	}
	var ce *connError
	var cfe *pgconn.ConnectError
	return errors.As(err, &ce) || errors.As(err, &cfe)
}
