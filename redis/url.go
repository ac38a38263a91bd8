package redis

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisclient"
	goredis "github.com/redis/go-redis/v9"
)

func init() {
	dlockdriver.Register("redis", open)
	dlockdriver.Register("rediss", open)
}

// open is the dlockdriver.OpenFunc for redis:// and rediss:// URLs.
// The client connects lazily; dlock.Open calls the driver's Ping.
func open(ctx context.Context, u *url.URL) (dlockdriver.Driver, error) {
	gopts, opts, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	client := goredis.NewClient(gopts)
	d := newDriver(client, opts, true)
	d.addr = dlockdriver.RedactURL(u)
	if d.compat {
		return d, nil
	}
	return &queueDriver{d}, nil
}

// Parameters this package takes out of a URL before go-redis sees it.
const (
	paramPrefix             = "prefix"
	paramCompat             = "compat"
	paramMinReplicas        = "min_replicas"
	paramMinReplicasTimeout = "min_replicas_timeout"
)

// ParseURL turns a redis:// or rediss:// URL into go-redis options and the
// driver's, without any network I/O. Every error matches dlock.ErrInvalid and
// leaves the URL's password out.
func ParseURL(u *url.URL) (*goredis.Options, *Options, error) {
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, nil, invalid("scheme %q is not redis or rediss", u.Scheme)
	}
	if u.Opaque != "" {
		return nil, nil, invalid("URL must look like redis://host:port/db")
	}
	if strings.Contains(u.Host, ",") {
		return nil, nil, invalid("redis:// takes one host; a comma-separated host list belongs to a redlock:// URL " +
			"(for a Cluster or Sentinel, pass go-redis's client to redis.New)")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, dlockdriver.QueryError("redis", err)
	}
	lock, err := dlock.OptionsFromQuery(q)
	if err != nil {
		return nil, nil, err
	}
	opts := &Options{Defaults: *lock}
	p := dlockdriver.Params{Q: q, Driver: "redis"}
	if v, ok := p.Take(paramPrefix); ok {
		opts.KeyPrefix = v
	}
	opts.Compat, _ = p.TakeBool(paramCompat)
	if v, ok := p.Take(paramMinReplicas); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, nil, invalid("%s=%q is not a count of replicas", paramMinReplicas, v)
		}
		opts.MinReplicas = n
	}
	opts.MinReplicasTimeout, _ = p.TakeDuration(paramMinReplicasTimeout)
	tlsp := p.TakeTLS()
	if p.Err != nil {
		return nil, nil, p.Err
	}
	if u.Scheme != "rediss" && p.TLS {
		return nil, nil, invalid("TLS parameters need a rediss:// URL")
	}

	rest := *u
	rest.RawQuery = q.Encode()
	gopts, err := redisclient.ParseURL(&rest, u, "redis")
	if err != nil {
		return nil, nil, err
	}
	if u.Scheme == "rediss" {
		cfg := gopts.TLSConfig // ServerName: the host, MinVersion: TLS 1.2, skip_verify
		if err := tlsp.Apply(cfg); err != nil {
			return nil, nil, err
		}
	}
	return gopts, opts, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: redis: %s", dlock.ErrInvalid, fmt.Sprintf(format, args...))
}
