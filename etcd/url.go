package etcd

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/reach"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
)

func init() {
	dlockdriver.Register("etcd", open)
	dlockdriver.Register("etcds", open)
}

// defaultDialTimeout bounds connecting and authenticating when the URL does
// not say.
const defaultDialTimeout = 5 * time.Second

// Parameters this package reads from a URL, besides dlock's.
const (
	paramDialTimeout  = "dial_timeout"
	paramKeepAlive    = "dial_keep_alive_time"
	paramKeepAliveTO  = "dial_keep_alive_timeout"
	paramAutoSync     = "auto_sync_interval"
	paramLeasePerLock = "lease_per_lock"
	defaultClientPort = "2379"
)

// open is the dlockdriver.OpenFunc for etcd:// and etcds:// URLs. The
// client is made by the driver's Ping, which dlock.Open calls once the lock
// options are known to be valid.
func open(ctx context.Context, u *url.URL) (dlockdriver.Driver, error) {
	cfg, opts, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	d := newDriver(nil, opts, true)
	d.cfg, d.addr = cfg, dlockdriver.RedactURL(u)
	return d, nil
}

// Ping makes the client of a driver opened from a URL and reads once under
// the prefix, so that the address, the credentials and the permission are
// checked here rather than at the first lock. ctx bounds it.
func (d *driver) Ping(ctx context.Context) error {
	if d.cfg == nil {
		return nil
	}
	cfg := *d.cfg
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < cfg.DialTimeout {
			cfg.DialTimeout = max(left, time.Millisecond)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("etcd: connecting to %s: %w", d.addr, err)
	}
	// gRPC retries a refused connection until DialTimeout: when no endpoint
	// accepts a TCP connection at all, say so at once.
	hosts := make([]string, len(cfg.Endpoints))
	for i, ep := range cfg.Endpoints {
		hosts[i] = ep
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			hosts[i] = u.Host // "https://h:2379" forms
		}
	}
	if err := reach.Any(ctx, hosts, cfg.DialTimeout); err != nil {
		return fmt.Errorf("etcd: connecting to %s: %w", d.addr, err)
	}
	client, err := clientv3.New(cfg) // authenticates, bounded by DialTimeout
	if err != nil {
		return fmt.Errorf("etcd: connecting to %s: %w", d.addr, err)
	}
	d.c = client
	if _, err := client.Get(ctx, d.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)); err != nil {
		return fmt.Errorf("etcd: connecting to %s: %w", d.addr, err)
	}
	return nil
}

// ParseURL returns the client configuration and the driver options that an
// etcd:// or etcds:// URL stands for (see the package doc), without any I/O
// except reading the TLS files it names: for example to make a client of
// one's own, or a concurrency.Session, from the same URL. The configuration
// has a logger that discards everything. Every error matches
// dlock.ErrInvalid and leaves the URL's password out.
func ParseURL(u *url.URL) (*clientv3.Config, *Options, error) {
	if u.Scheme != "etcd" && u.Scheme != "etcds" {
		return nil, nil, invalid("scheme %q is not etcd or etcds", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, nil, invalid("URL must look like etcd://host:2379[,host:2379…][/prefix]")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, dlockdriver.QueryError("etcd", err)
	}
	lock, err := dlock.OptionsFromQuery(q)
	if err != nil {
		return nil, nil, err
	}
	opts := &Options{Defaults: *lock, KeyPrefix: DefaultKeyPrefix}
	if u.Path != "" {
		opts.KeyPrefix = u.Path
	}

	secure := u.Scheme == "etcds"
	cfg := &clientv3.Config{
		DialTimeout: defaultDialTimeout,
		Logger:      zap.NewNop(),
	}
	scheme := "http://"
	if secure {
		scheme = "https://"
	}
	p := dlockdriver.Params{Q: q, Driver: "etcd"}
	for _, h := range p.Hosts(u.Host, defaultClientPort) {
		cfg.Endpoints = append(cfg.Endpoints, scheme+h)
	}
	if p.Err != nil {
		return nil, nil, p.Err
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
		if cfg.Username == "" || cfg.Password == "" {
			return nil, nil, invalid("etcd authentication needs both a user and a password")
		}
	}

	if d, ok := p.TakeDuration(paramDialTimeout); ok {
		cfg.DialTimeout = d
	}
	cfg.DialKeepAliveTime, _ = p.TakeDuration(paramKeepAlive)
	cfg.DialKeepAliveTimeout, _ = p.TakeDuration(paramKeepAliveTO)
	cfg.AutoSyncInterval, _ = p.TakeDuration(paramAutoSync)
	opts.LeasePerLock, _ = p.TakeBool(paramLeasePerLock)
	tlsp := p.TakeTLS()
	if err := p.Done(); err != nil {
		return nil, nil, err
	}
	if !secure && p.TLS {
		return nil, nil, invalid("TLS parameters need an etcds:// URL")
	}
	if secure {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if err := tlsp.Apply(tc); err != nil {
			return nil, nil, err
		}
		cfg.TLS = tc
		if server := tlsp.ServerName; server != "" {
			// gRPC verifies each connection against its endpoint's host,
			// whatever tls.Config.ServerName says: name the server in the
			// handshake instead. (A later dial option replaces the
			// client's own credentials.)
			cfg.DialOptions = append(cfg.DialOptions, grpc.WithTransportCredentials(
				serverNameCreds{grpccreds.NewTLS(tc), server}))
		}
	}
	return cfg, opts, nil
}

// serverNameCreds are TLS credentials that verify the server against a
// fixed name rather than the endpoint's host.
type serverNameCreds struct {
	grpccreds.TransportCredentials
	name string
}

func (c serverNameCreds) ClientHandshake(ctx context.Context, _ string, conn net.Conn) (net.Conn, grpccreds.AuthInfo, error) {
	return c.TransportCredentials.ClientHandshake(ctx, c.name, conn)
}

func (c serverNameCreds) Clone() grpccreds.TransportCredentials {
	return serverNameCreds{c.TransportCredentials.Clone(), c.name}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: etcd: %s", dlock.ErrInvalid, fmt.Sprintf(format, args...))
}
