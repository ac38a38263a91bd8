package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/mysql/internal/ident"
)

const (
	// MinTTL is the shortest TTL the driver accepts: the server's
	// wait_timeout, which ends a silent holder's session and with it the
	// lock, counts in whole seconds. Longer TTLs are rounded up to whole
	// seconds, and the lease's ValidUntil counts the rounded TTL.
	MinTTL = time.Second
	// MaxTTL is the longest: wait_timeout's limit on Linux (one year).
	MaxTTL = 31536000 * time.Second
	// ExpirySlack is how long past its ValidUntil the server may still hold
	// a silent holder's lock: the wait_timeout is counted from the end of
	// the holder's last statement, which is later than when it was sent by
	// the statement's way to the server and its run there, and the lease's
	// ValidUntil is shortened by the clock drift margin besides.
	ExpirySlack = 200 * time.Millisecond
	// DefaultFenceTable is the fencing table's name when Options.FenceTable
	// is empty: a table in the connection's database.
	DefaultFenceTable = "dlock_fence"
	// MaxNameLen is the longest lock name the server takes (in characters);
	// LockName hashes longer ones.
	MaxNameLen = 64
)

// closeTimeout bounds putting back a lease's connection settings after a
// release, and the statements of Ping.
const closeTimeout = 5 * time.Second

// Options configure a Locker. A nil *Options means all defaults.
type Options struct {
	// Defaults are the Locker's default lock options (URL: ttl, refresh,
	// refresh_interval, retry_min, retry_max, metadata). Zero fields mean
	// the defaults documented on dlock.Options; a TTL below MinTTL is
	// rejected.
	Defaults dlock.Options

	// KeyPrefix is put before every lock name (URL: prefix=app/), to keep
	// apart applications that lock the same names on one server: user
	// locks are server-wide, not per database. Default "".
	KeyPrefix string

	// NoFencing turns fencing tokens off (URL: fencing=false): an
	// acquisition then writes nothing to disk (and on an application's
	// pool takes one round trip less), and the driver needs no table, no
	// database and no CREATE privilege. Default false.
	NoFencing bool

	// FenceTable names the one-row table the fencing tokens come from (URL:
	// fence_table=locks.fence), made on first use with CREATE TABLE IF NOT
	// EXISTS: a name in the connection's database, or schema.name. Every
	// Locker that fences locks of one server must use the same table:
	// tokens of different tables are not ordered. Default
	// DefaultFenceTable.
	FenceTable string
}

// check rejects bad options before any I/O.
func (o *Options) check() error {
	if o == nil {
		return nil
	}
	if o.FenceTable != "" {
		if err := ident.CheckTable("fence table", o.FenceTable); err != nil {
			return invalid("%v", err)
		}
	}
	if !utf8.ValidString(o.KeyPrefix) {
		return invalid("prefix is not valid UTF-8")
	}
	return nil
}

// New returns a Locker taking its connections from the application's
// database handle, which must reach a MariaDB (10.3 or later) or, with
// NoFencing, a MySQL server. Each lease holds one of db's connections for
// its whole life, and each waiting Acquire one while it waits, so
// db.SetMaxOpenConns bounds the leases too (and past it, an acquisition
// waits for a connection). db's connections may not take several
// statements per request, so the driver sends one per request: an
// acquisition takes up to two round trips more than on a pool of its own
// (see Round trips in the package doc). Closing the Locker does not close
// db.
func New(db *sql.DB, opts *Options) (*dlock.Locker, error) {
	if db == nil {
		return nil, invalid("nil *sql.DB")
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	d := newDriver(db, opts, false)
	return dlock.New(d, &d.defaults)
}

// LockName is the name of dlock's lock name on the server, as GET_LOCK,
// IS_USED_LOCK and RELEASE_LOCK take it: prefix+name itself when it has at
// most MaxNameLen characters, else "dlock:" followed by the first 58 hex
// digits of its SHA-256.
func LockName(prefix, name string) string {
	key := prefix + name
	if utf8.RuneCountInString(key) <= MaxNameLen {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "dlock:" + hex.EncodeToString(sum[:])[:MaxNameLen-len("dlock:")]
}

func newDriver(db *sql.DB, opts *Options, ownsDB bool) *driver {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.FenceTable == "" {
		o.FenceTable = DefaultFenceTable
	}
	d := &driver{
		db:       db,
		ownsDB:   ownsDB,
		defaults: o.Defaults,
		prefix:   o.KeyPrefix,
		fencing:  !o.NoFencing,
		table:    ident.Quote(o.FenceTable),
		leases:   make(map[*lease]struct{}),
		// The pools the driver opens itself (from a URL, NewFromConfig)
		// take several statements per request; an application's may not.
		multi: ownsDB,
	}
	d.fence = withTable(fenceSQL, d.table)
	return d
}

// driver is the dlock driver on one *sql.DB.
type driver struct {
	db       *sql.DB
	ownsDB   bool
	defaults dlock.Options
	addr     string // the redacted URL, when opened from one
	prefix   string
	fencing  bool
	table    string // the fencing table, quoted
	fence    string // fence.sql on it
	// multi: the pool's connections take several statements per request
	// (the pools the driver opens itself), so that an attempt, a release
	// and their session settings go in one round trip.
	multi bool

	tableMu    sync.Mutex
	tableReady bool // the table exists (made or found once)

	mu     sync.Mutex
	closed bool
	leases map[*lease]struct{} // granted and not yet ended

	kills sync.WaitGroup // ends of given-up waits' sessions (kill), which Close waits for
}

func (d *driver) Capabilities() dlock.Capabilities {
	return dlock.Capabilities{
		Fencing:     d.fencing,
		MinTTL:      MinTTL,
		ExpirySlack: ExpirySlack,
		// The session holds the lock: its end, for whatever reason, frees it.
		ConnectionBound: true,
		// A waiter waits in GET_LOCK, which the server ends when the lock
		// is released or its holder's session ends (wait.go).
		NotifiedWait: true,
	}
}

// Ping connects and, with fencing, makes or finds the fencing table, so
// that a Locker opened from a URL fails at Open rather than at its first
// acquisition. ctx bounds it.
func (d *driver) Ping(ctx context.Context) error {
	where := ""
	if d.addr != "" {
		where = " to " + d.addr
	}
	if err := d.db.PingContext(ctx); err != nil {
		return fmt.Errorf("mysql: connecting%s: %w", where, err)
	}
	if d.fencing {
		if err := d.ensureTable(ctx, d.db); err != nil {
			return fmt.Errorf("mysql: opening%s: %w", where, err)
		}
	}
	return nil
}

// execer is a *sql.DB or a *sql.Conn.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// ensureTable makes the fencing table unless it was made or found
// already by this driver.
func (d *driver) ensureTable(ctx context.Context, on execer) error {
	d.tableMu.Lock()
	defer d.tableMu.Unlock()
	if d.tableReady {
		return nil
	}
	for _, stmt := range strings.Split(withTable(fenceCreateSQL, d.table), ";\n") {
		if _, err := on.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("making the fencing table %s (the user needs CREATE and INSERT on its database, or fencing=false): %w", d.table, err)
		}
	}
	d.tableReady = true
	return nil
}

// seconds is ttl as wait_timeout: whole seconds, rounded up (a TTL is never
// shortened).
func seconds(ttl time.Duration) (int64, error) {
	if ttl > MaxTTL {
		return 0, invalid("TTL %v is above wait_timeout's limit of %v", ttl, MaxTTL)
	}
	return int64((ttl + time.Second - 1) / time.Second), nil
}

// TryAcquire takes a connection of the pool for the lease and makes one
// attempt on it (try). ctx bounds it; cut short after GET_LOCK was sent,
// the connection is closed, which frees the lock the server may have
// granted (as soon as the server sees the close, at the TTL at the latest).
func (d *driver) TryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	secs, err := seconds(req.TTL)
	if err != nil {
		return nil, err
	}
	c, err := d.conn(ctx)
	if err != nil {
		return nil, err
	}
	key := LockName(d.prefix, req.Name)
	g, _, err := d.try(ctx, c, key, secs, req.TTL)
	if err != nil || g != nil {
		return g, err
	}
	return nil, d.busy(ctx, c, key, secs)
}

// conn takes a connection of the pool for an acquisition and, with
// fencing, makes sure that the fencing table exists.
func (d *driver) conn(ctx context.Context) (*sql.Conn, error) {
	if d.isClosed() {
		return nil, dlock.ErrClosed
	}
	c, err := d.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("mysql: getting a connection: %w", err)
	}
	if d.fencing {
		if err := d.ensureTable(ctx, c); err != nil {
			discard(c)
			return nil, fmt.Errorf("mysql: %w", err)
		}
	}
	return c, nil
}

// try makes one attempt on c: it sets the session's wait_timeout to the
// TTL, tries GET_LOCK and, granted, takes the fencing token. On the
// driver's own pools that is one request (try_fence.sql, or try.sql
// without fencing, behind the SET); on an application's pool, whose
// connections may not take several statements at once, one request per
// statement. A grant has c; a busy attempt (nil grant, nil error) leaves
// c to the caller; an error has closed c. connID is the session's.
func (d *driver) try(ctx context.Context, c *sql.Conn, key string, secs int64, ttl time.Duration) (g *dlockdriver.Grant, connID int64, err error) {
	var (
		got, id sql.NullInt64
		changed int64  // the rows the fence UPDATE changed (batched)
		fence   uint64 // its token
	)
	timeout := fill(setTimeoutSQL, "$SECS", num(secs))
	switch {
	case d.multi && d.fencing:
		err = c.QueryRowContext(ctx, batch(timeout, fill(tryFenceSQL, "$TABLE", d.table, "$KEY", literal(key)))).Scan(&got, &id, &changed, &fence)
	case d.multi:
		err = c.QueryRowContext(ctx, batch(timeout, fill(trySQL, "$KEY", literal(key)))).Scan(&got, &id)
	default:
		if _, err := c.ExecContext(ctx, timeout); err != nil {
			discard(c)
			return nil, 0, fmt.Errorf("mysql: setting wait_timeout: %w", err)
		}
		err = c.QueryRowContext(ctx, fill(trySQL, "$KEY", literal(key))).Scan(&got, &id)
	}
	if err != nil {
		discard(c) // frees the lock if the server granted it
		return nil, 0, fmt.Errorf("mysql: GET_LOCK: %w", err)
	}
	switch {
	case !got.Valid:
		discard(c)
		return nil, 0, errors.New("mysql: GET_LOCK returned NULL (the session was killed)")
	case got.Int64 == 0:
		return nil, id.Int64, nil
	}
	if d.fencing {
		if d.multi {
			if changed != 1 {
				discard(c) // frees the lock
				return nil, 0, fmt.Errorf("mysql: taking the fencing token: the fencing table %s has no row 1", d.table)
			}
		} else if fence, err = d.takeFence(ctx, c); err != nil {
			return nil, 0, err
		}
	}
	g, err = d.granted(ctx, c, key, id.Int64, fence, secs, ttl)
	return g, id.Int64, err
}

// takeFence takes the next fencing token on c, whose session holds the
// lock (fence.sql); on an error it closes c, which frees the lock.
func (d *driver) takeFence(ctx context.Context, c *sql.Conn) (uint64, error) {
	res, err := c.ExecContext(ctx, d.fence)
	var id int64
	if err == nil {
		id, err = res.LastInsertId()
	}
	if err != nil {
		discard(c)
		return 0, fmt.Errorf("mysql: taking the fencing token: %w", err)
	}
	return uint64(id), nil
}

// granted makes the lease of a grant on c, whose session holds key's
// lock with wait_timeout secs; ttl is the one asked for.
func (d *driver) granted(ctx context.Context, c *sql.Conn, key string, connID int64, fence uint64, secs int64, ttl time.Duration) (*dlockdriver.Grant, error) {
	if !alive(c) {
		// ctx ended as the last statement was answered, and the client
		// library closed the session for it: the lock went with it.
		discard(c)
		return nil, fmt.Errorf("mysql: the session ended with ctx after GET_LOCK: %w", cause(ctx))
	}
	l := newLease(d, c, key, connID, fence, secs)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		discard(c)
		return nil, dlock.ErrClosed
	}
	d.leases[l] = struct{}{}
	d.mu.Unlock()
	g := &dlockdriver.Grant{Handle: l, Fence: fence}
	if granted := time.Duration(secs) * time.Second; granted != ttl {
		g.TTL = granted
	}
	return g, nil
}

// busy is the error of an attempt that found the lock held, with a hint:
// how long the holder's session has left before wait_timeout ends it,
// assuming the holder's TTL is secs, the requester's (another session's
// wait_timeout cannot be read). A wrong guess only moves the waiter's next
// attempt. It puts c back into the pool, in the same request on the
// driver's own pools.
func (d *driver) busy(ctx context.Context, c *sql.Conn, key string, secs int64) error {
	var idle sql.NullFloat64
	q := fill(idleSQL, "$KEY", literal(key))
	var err error
	if d.multi {
		// The SET first: a failed SET fails the request, a missing row
		// (the idle statement's) does not.
		err = c.QueryRowContext(ctx, batch(resetTimeoutSQL, q)).Scan(&idle)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			discard(c)
		} else {
			_ = c.Close()
		}
	} else {
		err = c.QueryRowContext(ctx, q).Scan(&idle)
		d.putBack(c)
	}
	var left time.Duration
	switch {
	case errors.Is(err, sql.ErrNoRows):
		left = endingSoon // the holder's session is ending, or the lock is free now
	case err == nil && idle.Valid:
		left = time.Duration(secs)*time.Second - time.Duration(idle.Float64*float64(time.Millisecond))
		left = max(left, endingSoon) // past due: the server is ending the session
	}
	return dlockdriver.Busy(left)
}

// endingSoon is the hint of a busy attempt that found the holder's session
// ending or overdue: the server frees the lock within a few milliseconds.
const endingSoon = 5 * time.Millisecond

// putBack puts a connection that holds no lock back into the pool, with
// wait_timeout as the server's default; one that cannot be put back so is
// closed.
func (d *driver) putBack(c *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if _, err := c.ExecContext(ctx, resetTimeoutSQL); err != nil {
		discard(c)
		return
	}
	_ = c.Close()
}

// alive reports whether c's session is still open. The client library
// watches a statement's ctx until the statement's answer is read, and when
// the ctx ends at that moment it may close the connection although the
// statement succeeded: a statement's success alone does not show that the
// session, and the locks it holds, outlived it.
func alive(c *sql.Conn) bool {
	ok := true
	err := c.Raw(func(dc any) error {
		if v, is := dc.(sqldriver.Validator); is {
			ok = v.IsValid()
		}
		return nil
	})
	return ok && err == nil
}

// cause is ctx's error, or ErrBadConn when the session ended without it.
func cause(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return sqldriver.ErrBadConn
}

// discard closes a connection instead of returning it to the pool: its
// session, and every lock it holds, ends.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return sqldriver.ErrBadConn })
	_ = c.Close()
}

func (d *driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// Close closes the connections of leases that were not released (the
// Locker released the others), waits for the ends of given-up waits (each
// bounded by killTimeout), and closes the pool when Open made it.
func (d *driver) Close() error {
	d.mu.Lock()
	d.closed = true
	leases := make([]*lease, 0, len(d.leases))
	for l := range d.leases {
		leases = append(leases, l)
	}
	d.mu.Unlock()
	for _, l := range leases {
		l.end(false)
	}
	d.kills.Wait()
	if d.ownsDB {
		return d.db.Close()
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: mysql: %s", dlock.ErrInvalid, fmt.Sprintf(format, args...))
}
