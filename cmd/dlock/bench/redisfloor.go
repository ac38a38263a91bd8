package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock"
	goredis "github.com/redis/go-redis/v9"
)

// redisUnlock is the floor's compare-and-delete: the classic single-instance
// Redis unlock (the Redis documentation's, bsm/redislock's and redsync's).
//
// KEYS[1] the lock key; ARGV[1] the token. Returns 1 when deleted, else 0.
var redisUnlock = goredis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

// RedisFloors returns an opener of raw Redis floors for the server of a
// redis:// or rediss:// URL, with the go-redis client options the redis
// driver derives from the same URL: go-redis's ParseURL of it (user,
// password, database, TLS, and go-redis's own query parameters such as
// pool_size or dial_timeout) with ContextTimeoutEnabled. The query
// parameters that are dlock's (ttl, refresh, …) or the driver's (prefix,
// compat, tls_*) are left out; so a rediss URL's tls_ca, tls_cert and
// tls_key are not applied to the floor. Each Floor is its own client.
//
// TryLock is `SET key token NX PX ttl`; Unlock runs the compare-and-delete
// script with EVALSHA (EVAL on the first use), as Redis clients do.
func RedisFloors(u *url.URL) (FloorOpener, error) {
	opts, err := redisOptions(u, "floor")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (Floor, error) {
		c, err := dialRedis(ctx, opts, "floor")
		if err != nil {
			return nil, err
		}
		return &redisFloor{c: c}, nil
	}, nil
}

// redisOptions are the go-redis client options for a redis:// or rediss://
// URL, as RedisFloors describes; what names the floor or peer in errors.
func redisOptions(u *url.URL, what string) (*goredis.Options, error) {
	if u == nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		return nil, fmt.Errorf("bench: the redis %s needs a redis:// or rediss:// URL", what)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("bench: the redis %s cannot use the URL: malformed query", what)
	}
	if _, err := dlock.OptionsFromQuery(q); err != nil { // deletes dlock's parameters
		return nil, err
	}
	for k := range q {
		if k == "prefix" || k == "compat" || strings.HasPrefix(k, "tls_") {
			delete(q, k)
		}
	}
	cp := *u
	cp.RawQuery, cp.Fragment = q.Encode(), ""
	opts, err := goredis.ParseURL(cp.String())
	if err != nil {
		// go-redis errors may quote the URL: keep the password out.
		return nil, fmt.Errorf("bench: the redis %s cannot use the URL (malformed host, port, database or go-redis parameter)", what)
	}
	opts.ContextTimeoutEnabled = true
	return opts, nil
}

// dialRedis makes a client and pings the server; what names the floor or
// peer in errors.
func dialRedis(ctx context.Context, opts *goredis.Options, what string) (*goredis.Client, error) {
	c := goredis.NewClient(opts)
	if err := c.Ping(ctx).Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("bench: redis %s: %w", what, err), c.Close())
	}
	return c, nil
}

type redisFloor struct{ c *goredis.Client }

func (f *redisFloor) TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	ms := max(ttl.Milliseconds(), 1)
	cmd := goredis.NewStatusCmd(ctx, "set", name, token, "nx", "px", strconv.FormatInt(ms, 10))
	_ = f.c.Process(ctx, cmd)
	switch err := cmd.Err(); {
	case errors.Is(err, goredis.Nil):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

func (f *redisFloor) Unlock(ctx context.Context, name, token string) error {
	return redisUnlock.Run(ctx, f.c, []string{name}, token).Err()
}

func (f *redisFloor) Close() error { return f.c.Close() }
