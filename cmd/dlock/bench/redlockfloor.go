package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	goredis "github.com/redis/go-redis/v9"
)

// RedlockFloors returns an opener of raw Redlock floors for the nodes of a
// redlock:// or redlocks:// URL: one go-redis client per node, with the
// options the redlock driver derives from the same URL (go-redis's ParseURL
// of each node's redis:// or rediss:// URL, with ContextTimeoutEnabled).
// The query parameters that are dlock's or the driver's (prefix, compat,
// node_timeout, drift, tls_*) are left out; so a redlocks URL's tls_ca,
// tls_cert and tls_key are not applied to the floor.
//
// The floor is the Redis documentation's Redlock, as redsync does it: TryLock
// sends `SET key token NX PX ttl` to every node at once, waits for every
// answer, and holds the lock when a majority said OK and the time taken
// leaves some validity (TTL − elapsed − TTL/100 − 2ms > 0); otherwise it
// unlocks every node. Unlock runs the compare-and-delete script (EVALSHA) on
// every node at once and waits for every answer. No fencing, no per-node
// timeout, no notification.
func RedlockFloors(u *url.URL) (FloorOpener, error) {
	nodes, err := redlockOptions(u, "floor")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (Floor, error) {
		f := &redlockFloor{}
		for _, o := range nodes {
			c := goredis.NewClient(o)
			f.clients = append(f.clients, c)
			if err := c.Ping(ctx).Err(); err != nil {
				return nil, errors.Join(fmt.Errorf("bench: redlock floor: %w", err), f.Close())
			}
		}
		return f, nil
	}, nil
}

// redlockOptions are the go-redis client options of each node of a
// redlock:// or redlocks:// URL, as RedlockFloors describes; what names the
// floor or peer in errors.
func redlockOptions(u *url.URL, what string) ([]*goredis.Options, error) {
	if u == nil || (u.Scheme != "redlock" && u.Scheme != "redlocks") {
		return nil, fmt.Errorf("bench: the redlock %s needs a redlock:// or redlocks:// URL", what)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("bench: the redlock %s cannot use the URL: malformed query", what)
	}
	if _, err := dlock.OptionsFromQuery(q); err != nil { // deletes dlock's parameters
		return nil, err
	}
	for k := range q {
		switch {
		case k == "prefix", k == "compat", k == "node_timeout", k == "drift", strings.HasPrefix(k, "tls_"):
			delete(q, k)
		}
	}
	scheme := "redis"
	if u.Scheme == "redlocks" {
		scheme = "rediss"
	}
	var nodes []*goredis.Options
	for _, h := range strings.Split(u.Host, ",") {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "6379")
		}
		cp := *u
		cp.Scheme, cp.Host, cp.RawQuery, cp.Fragment = scheme, h, q.Encode(), ""
		opts, err := goredis.ParseURL(cp.String())
		if err != nil {
			// go-redis errors may quote the URL: keep the password out.
			return nil, fmt.Errorf("bench: the redlock %s cannot use the URL (malformed host, port, database or go-redis parameter)", what)
		}
		opts.ContextTimeoutEnabled = true
		nodes = append(nodes, opts)
	}
	if n := len(nodes); n < 3 || n%2 == 0 {
		return nil, fmt.Errorf("bench: the redlock %s needs an odd number of nodes, at least 3 (got %d)", what, n)
	}
	return nodes, nil
}

type redlockFloor struct{ clients []*goredis.Client }

// each runs op on every node at once and returns how many said yes, and
// the errors.
func (f *redlockFloor) each(op func(c *goredis.Client) (bool, error)) (int, error) {
	oks := make([]bool, len(f.clients))
	errs := make([]error, len(f.clients))
	var wg sync.WaitGroup
	for i, c := range f.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			oks[i], errs[i] = op(c)
		}()
	}
	wg.Wait()
	n := 0
	for _, ok := range oks {
		if ok {
			n++
		}
	}
	return n, errors.Join(errs...)
}

func (f *redlockFloor) TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	start := time.Now()
	px := strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)
	n, err := f.each(func(c *goredis.Client) (bool, error) {
		cmd := goredis.NewStatusCmd(ctx, "set", name, token, "nx", "px", px)
		_ = c.Process(ctx, cmd)
		if errors.Is(cmd.Err(), goredis.Nil) {
			return false, nil
		}
		return cmd.Err() == nil, cmd.Err()
	})
	drift := ttl/100 + 2*time.Millisecond
	if n >= len(f.clients)/2+1 && time.Since(start) < ttl-drift {
		return true, nil
	}
	uerr := f.Unlock(context.WithoutCancel(ctx), name, token)
	if err != nil { // no majority, and not (only) because the lock is held
		return false, errors.Join(err, uerr)
	}
	return false, nil
}

func (f *redlockFloor) Unlock(ctx context.Context, name, token string) error {
	_, err := f.each(func(c *goredis.Client) (bool, error) {
		return true, redisUnlock.Run(ctx, c, []string{name}, token).Err()
	})
	return err
}

func (f *redlockFloor) Close() error {
	errs := make([]error, len(f.clients))
	for i, c := range f.clients {
		errs[i] = c.Close()
	}
	return errors.Join(errs...)
}
