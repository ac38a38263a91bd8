package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

func init() {
	dlockdriver.Register("postgres", open)
	dlockdriver.Register("postgresql", open)
}

// DefaultMaxConns is the pool size of a Locker opened from a URL without
// pool_max_conns.
const DefaultMaxConns = 32

// Parameters this package takes out of a URL before pgx sees it.
const (
	paramPrefix        = "prefix"
	paramFencing       = "fencing"
	paramSessionPooler = "session_pooler"
	paramFenceSchema   = "fence_schema"
	paramShared        = "shared_sessions"
	paramSharedConns   = "shared_conns"
	paramWaitConns     = "wait_conns"
)

// open is the dlockdriver.OpenFunc for postgres:// and postgresql:// URLs.
// The pool connects lazily; dlock.Open calls the driver's Ping.
func open(ctx context.Context, u *url.URL) (dlockdriver.Driver, error) {
	cfg, opts, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: opening %s: %w", dlockdriver.RedactURL(u), err)
	}
	d := newDriver(pool, opts, true)
	d.addr = dlockdriver.RedactURL(u)
	return d.api(), nil
}

// ParseURL turns a postgres:// or postgresql:// URL into a pool
// configuration and the driver's options, without network I/O: dlock's lock
// options and the driver's own parameters (see the package doc) are taken
// out, the rest goes to pgxpool.ParseConfig. Every error matches
// dlock.ErrInvalid and leaves the password out. It is what Open uses; call it
// to adjust the configuration (a TLS config, pgx hooks) before
// NewFromConfig.
func ParseURL(u *url.URL) (*pgxpool.Config, *Options, error) {
	if u == nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, nil, invalid("the URL's scheme is not postgres or postgresql")
	}
	if u.Opaque != "" {
		return nil, nil, invalid("URL must look like postgres://user:pass@host:port/database")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, dlockdriver.QueryError("postgres", err)
	}
	lock, err := dlock.OptionsFromQuery(q)
	if err != nil {
		return nil, nil, err
	}
	opts := &Options{Defaults: *lock}
	p := dlockdriver.Params{Q: q, Driver: "postgres"}
	opts.KeyPrefix, _ = p.Take(paramPrefix)
	if fencing, ok := p.TakeBool(paramFencing); ok {
		opts.NoFencing = !fencing
	}
	opts.FenceSchema, _ = p.Take(paramFenceSchema)
	opts.SessionPooler, _ = p.TakeBool(paramSessionPooler)
	if shared, ok := p.TakeBool(paramShared); ok {
		opts.SharedSessions, opts.NoSharedSessions = shared, !shared
	}
	for _, n := range []struct {
		param string
		into  *int
	}{{paramSharedConns, &opts.SharedConns}, {paramWaitConns, &opts.WaitConns}} {
		if v, ok := p.Take(n.param); ok {
			i, err := strconv.Atoi(v)
			if err != nil || i < 1 {
				return nil, nil, invalid("%s=%q: want a whole number of at least 1", n.param, v)
			}
			*n.into = i
		}
	}
	if p.Err != nil { // what is left goes to pgx, which knows its parameters
		return nil, nil, p.Err
	}
	_, sized := q["pool_max_conns"]

	rest := *u
	rest.RawQuery = q.Encode()
	rest.Fragment = ""
	cfg, err := pgxpool.ParseConfig(rest.String())
	if err != nil {
		return nil, nil, invalid("%s", redactText(err, u))
	}
	if !sized {
		cfg.MaxConns = DefaultMaxConns
	}
	return cfg, opts, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: postgres: %s", dlock.ErrInvalid, fmt.Sprintf(format, args...))
}

// redactText is err's text with u's password, if any, replaced. pgx's own
// errors already leave it out; this makes sure.
func redactText(err error, u *url.URL) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // url.Error quotes the whole URL
	}
	return dlockdriver.RedactText(err.Error(), u)
}
