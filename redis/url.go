package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/urlparams"
	goredis "github.com/redis/go-redis/v9"
)

func init() {
	dlock.Register("redis", open)
	dlock.Register("rediss", open)
}

// open is the dlock.OpenFunc for redis:// and rediss:// URLs.
func open(ctx context.Context, u *url.URL) (dlock.Locker, error) {
	gopts, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	client := goredis.NewClient(gopts) // connects lazily
	l, err := newLocker(client, opts, true)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	if err := client.Ping(ctx).Err(); err != nil {
		_ = l.Close(context.Background()) // closes the client
		return nil, fmt.Errorf("redis: connecting to %s: %w", dlock.Redact(u), urlparams.Redact(err, u))
	}
	return l, nil
}

// Parameters this package takes out of a URL before go-redis sees it.
const (
	paramPrefix = "prefix"
	paramCompat = "compat"
)

// parseURL turns a redis:// or rediss:// URL into go-redis options and the
// driver's, without any network I/O. Every error matches dlock.ErrInvalid and
// leaves the URL's password out.
func parseURL(u *url.URL) (*goredis.Options, *Options, error) {
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, nil, invalid("scheme %q is not redis or rediss", u.Scheme)
	}
	if u.Opaque != "" {
		return nil, nil, invalid("URL must look like redis://host:port/db")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, invalid("malformed query: %v", urlparams.RedactText(err.Error(), u))
	}
	lock, err := dlock.OptionsFromQuery(q)
	if err != nil {
		return nil, nil, err
	}
	opts := &Options{Lock: *lock}
	p := urlparams.Params{Q: q, Driver: "redis"}
	if v, ok := p.Take(paramPrefix); ok {
		opts.KeyPrefix = v
	}
	opts.Compat, _ = p.TakeBool(paramCompat)
	tlsp := p.TakeTLS()
	if p.Err != nil {
		return nil, nil, p.Err
	}
	if u.Scheme != "rediss" && p.TLS {
		return nil, nil, invalid("TLS parameters need a rediss:// URL")
	}

	rest := *u
	rest.RawQuery = q.Encode()
	gopts, err := goredis.ParseURL(rest.String())
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the whole URL
		}
		return nil, nil, invalid("%s", strings.TrimPrefix(urlparams.RedactText(err.Error(), u), "redis: "))
	}
	gopts.ContextTimeoutEnabled = true
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
