package mysql

import (
	"context"
	"crypto/tls"
	"database/sql"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	gomysql "github.com/go-sql-driver/mysql"
)

func init() {
	dlockdriver.Register("mysql", open)
}

// Defaults of a Locker opened from a URL.
const (
	// DefaultPort is the server's port when the URL gives none.
	DefaultPort = "3306"
	// DefaultConnectTimeout bounds dialling the server, TLS and
	// authentication included, when the URL has no connect_timeout.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultMaxIdleConns is how many idle connections the pool keeps for
	// the next leases, when the URL has no max_idle_conns.
	DefaultMaxIdleConns = 8
)

// Parameters this package takes out of a URL.
const (
	paramPrefix         = "prefix"
	paramFencing        = "fencing"
	paramFenceTable     = "fence_table"
	paramTLS            = "tls"
	paramConnectTimeout = "connect_timeout"
	paramMaxOpenConns   = "max_open_conns"
	paramMaxIdleConns   = "max_idle_conns"
)

// open is the dlockdriver.OpenFunc for mysql:// URLs. The pool connects
// lazily; dlock.Open calls the driver's Ping.
func open(_ context.Context, u *url.URL) (dlockdriver.Driver, error) {
	cfg, pool, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	cfg.MultiStatements = true // see driver.multi
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, invalid("%s", dlockdriver.RedactText(err.Error(), u))
	}
	db := sql.OpenDB(conn)
	pool.apply(db)
	d := newDriver(db, opts, true)
	d.addr = dlockdriver.RedactURL(u)
	return d, nil
}

// NewFromConfig opens a pool on cfg (from ParseURL, adjusted: a TLS config,
// a dialer), checks that the server answers and, with fencing, that the
// fencing table exists (bounded by ctx), and returns a Locker that owns
// the pool and closes it on Close. The pool's connections take several
// statements per request (a copy of cfg with MultiStatements), which the
// driver uses to save round trips; cfg itself is left as it is.
func NewFromConfig(ctx context.Context, cfg *gomysql.Config, opts *Options) (*dlock.Locker, error) {
	if cfg == nil {
		return nil, invalid("nil config")
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	cfg = cfg.Clone()
	cfg.MultiStatements = true
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, invalid("%v", err)
	}
	db := sql.OpenDB(conn)
	poolDefaults.apply(db)
	d := newDriver(db, opts, true)
	l, err := dlock.New(d, &d.defaults)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := d.Ping(ctx); err != nil {
		_ = l.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return l, nil
}

// poolSize is the URL's sizing of the pool.
type poolSize struct{ maxOpen, maxIdle int }

var poolDefaults = poolSize{maxIdle: DefaultMaxIdleConns}

func (p poolSize) apply(db *sql.DB) {
	db.SetMaxOpenConns(p.maxOpen)
	db.SetMaxIdleConns(p.maxIdle)
}

// ParseURL turns a mysql:// URL into the client's configuration and the
// driver's options, without network I/O:
//
//	mysql://user:pass@host:port/database?params
//
// dlock's lock options (ttl, refresh, …) go to Options.Defaults; prefix,
// fencing and fence_table to Options; tls=true (verified against the
// system's CAs) or the tls_* parameters of package dlock/driver (tls_ca,
// tls_cert and tls_key, tls_server_name, tls_insecure_skip_verify) turn
// TLS on; connect_timeout bounds a dial (default 10s). Any other parameter
// is rejected. Every error matches dlock.ErrInvalid and leaves the
// password out. The pool sizes (max_open_conns, default unlimited;
// max_idle_conns, default 8) are for Open only: set them on the *sql.DB
// of New.
func ParseURL(u *url.URL) (*gomysql.Config, *Options, error) {
	cfg, _, opts, err := parseURL(u)
	return cfg, opts, err
}

func parseURL(u *url.URL) (*gomysql.Config, poolSize, *Options, error) {
	var pool poolSize
	fail := func(err error) (*gomysql.Config, poolSize, *Options, error) { return nil, pool, nil, err }
	if u == nil || u.Scheme != "mysql" {
		return fail(invalid("the URL's scheme is not mysql"))
	}
	if u.Opaque != "" || u.Host == "" {
		return fail(invalid("URL must look like mysql://user:pass@host:port/database"))
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return fail(dlockdriver.QueryError("mysql", err))
	}
	lock, err := dlock.OptionsFromQuery(q)
	if err != nil {
		return fail(err)
	}
	opts := &Options{Defaults: *lock}
	p := dlockdriver.Params{Q: q, Driver: "mysql"}
	opts.KeyPrefix, _ = p.Take(paramPrefix)
	if fencing, ok := p.TakeBool(paramFencing); ok {
		opts.NoFencing = !fencing
	}
	opts.FenceTable, _ = p.Take(paramFenceTable)
	useTLS, _ := p.TakeBool(paramTLS)
	tlsp := p.TakeTLS()
	timeout, ok := p.TakeDuration(paramConnectTimeout)
	if !ok {
		timeout = DefaultConnectTimeout
	}
	pool = poolDefaults
	for _, n := range []struct {
		param string
		into  *int
	}{{paramMaxOpenConns, &pool.maxOpen}, {paramMaxIdleConns, &pool.maxIdle}} {
		if v, ok := p.Take(n.param); ok {
			i, err := strconv.Atoi(v)
			if err != nil || i < 0 {
				return fail(invalid("%s=%q: want a whole number, 0 or more", n.param, v))
			}
			*n.into = i
		}
	}
	hosts := p.Hosts(u.Host, DefaultPort)
	if err := p.Done(); err != nil {
		return fail(err)
	}
	if len(hosts) != 1 {
		return fail(invalid("one host, not %d", len(hosts)))
	}
	if err := opts.check(); err != nil {
		return fail(err)
	}
	if opts.Defaults.TTL != 0 && opts.Defaults.TTL < MinTTL {
		return fail(invalid("ttl=%v is below the driver's minimum of %v", opts.Defaults.TTL, MinTTL))
	}
	db := strings.TrimPrefix(u.Path, "/")
	if strings.Contains(db, "/") {
		return fail(invalid("the URL's path is one database name"))
	}

	cfg := gomysql.NewConfig()
	cfg.Net = "tcp"
	cfg.Addr = hosts[0]
	cfg.DBName = db
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.Timeout = timeout
	// Errors reach the application through dlock's; nothing is logged.
	cfg.Logger = &gomysql.NopLogger{}
	if useTLS || p.TLS {
		host, _, _ := net.SplitHostPort(hosts[0])
		t := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
		if err := tlsp.Apply(t); err != nil {
			return fail(err)
		}
		cfg.TLS = t
	}
	return cfg, pool, opts, nil
}
