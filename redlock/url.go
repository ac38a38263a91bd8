package redlock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"sync"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisclient"
	goredis "github.com/redis/go-redis/v9"
)

func init() {
	dlockdriver.Register("redlock", open)
	dlockdriver.Register("redlocks", open)
}

// open is the dlockdriver.OpenFunc for redlock:// and redlocks:// URLs. The
// clients connect lazily; dlock.Open calls the driver's Ping.
func open(ctx context.Context, u *url.URL) (dlockdriver.Driver, error) {
	nodes, opts, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	clients := make([]goredis.UniversalClient, len(nodes))
	for i, o := range nodes {
		clients[i] = goredis.NewClient(o) // connects lazily
	}
	d, err := newDriver(clients, opts, true)
	if err != nil {
		for _, c := range clients {
			_ = c.Close()
		}
		return nil, err
	}
	d.addr = dlockdriver.RedactURL(u)
	return d, nil
}

// Ping checks that a majority of the nodes answer, for dlock.Open; a
// minority may be down at start.
func (d *driver) Ping(ctx context.Context) error {
	errs := make([]error, len(d.nodes))
	var wg sync.WaitGroup
	for i, nd := range d.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := nd.c.Ping(ctx).Err(); err != nil {
				errs[i] = fmt.Errorf("%s: %w", nd.name, err)
			}
		}()
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	if failed > len(d.nodes)-d.quorum {
		return fmt.Errorf("redlock: connecting to %s: %d of %d nodes failed: %w", d.addr, failed, len(d.nodes), errors.Join(errs...))
	}
	return nil
}

// Parameters this package takes out of a URL before go-redis sees it.
const (
	paramPrefix      = "prefix"
	paramCompat      = "compat"
	paramNodeTimeout = "node_timeout"
	paramDrift       = "drift"
)

// defaultPort is the port of a host listed without one.
const defaultPort = "6379"

// ParseURL turns a redlock:// or redlocks:// URL into go-redis options for
// every node and the driver's options, without any network I/O. Every error
// matches dlock.ErrInvalid and leaves the URL's password out.
//
// The TLS parameters are those of the redis driver's rediss:// URLs.
func ParseURL(u *url.URL) ([]*goredis.Options, *Options, error) {
	if u.Scheme != "redlock" && u.Scheme != "redlocks" {
		return nil, nil, invalid("scheme %q is not redlock or redlocks", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, nil, invalid("URL must look like redlock://host1:port1,host2:port2,host3:port3/db")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, dlockdriver.QueryError("redlock", err)
	}
	lock, err := dlock.OptionsFromQuery(q)
	if err != nil {
		return nil, nil, err
	}
	opts := &Options{Defaults: *lock}
	p := dlockdriver.Params{Q: q, Driver: "redlock"}
	if v, ok := p.Take(paramPrefix); ok {
		opts.KeyPrefix = v
	}
	opts.Compat, _ = p.TakeBool(paramCompat)
	opts.NodeTimeout, _ = p.TakeDuration(paramNodeTimeout)
	opts.Drift, _ = p.TakeDuration(paramDrift)
	tlsp := p.TakeTLS()
	if p.Err != nil {
		return nil, nil, p.Err
	}
	secure := u.Scheme == "redlocks"
	if !secure && p.TLS {
		return nil, nil, invalid("TLS parameters need a redlocks:// URL")
	}

	hosts := p.Hosts(u.Host, defaultPort)
	if p.Err != nil {
		return nil, nil, p.Err
	}
	if n := len(hosts); n < 3 || n%2 == 0 {
		return nil, nil, invalid("%d nodes: Redlock needs an odd number, at least 3", n)
	}

	var tlsCfg *tls.Config
	if secure {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if err := tlsp.Apply(tlsCfg); err != nil {
			return nil, nil, err
		}
	}

	scheme := "redis"
	if secure {
		scheme = "rediss"
	}
	nodes := make([]*goredis.Options, len(hosts))
	for i, h := range hosts {
		one := *u
		one.Scheme, one.Host, one.RawQuery, one.Fragment = scheme, h, q.Encode(), ""
		o, err := redisclient.ParseURL(&one, u, "redlock")
		if err != nil {
			return nil, nil, err
		}
		// One dial per attempt: a node that refuses connections fails the
		// request at once instead of after go-redis's dial retries (the
		// quorum, not the client, copes with a node that is down).
		o.DialerRetries = 1
		if secure {
			// go-redis sets ServerName to the host and honours skip_verify;
			// the TLS parameters above apply to every node.
			cfg := tlsCfg.Clone()
			cfg.ServerName = o.TLSConfig.ServerName
			cfg.InsecureSkipVerify = cfg.InsecureSkipVerify || o.TLSConfig.InsecureSkipVerify
			if tlsp.ServerName != "" {
				cfg.ServerName = tlsp.ServerName
			}
			o.TLSConfig = cfg
		}
		nodes[i] = o
	}
	return nodes, opts, nil
}
