package driver

import (
	"context"
	"net/url"

	"github.com/dlock/dlock/internal/registry"
)

// OpenFunc builds a Driver from a URL, for dlock.Open. Open has already taken
// the lock options (ttl, refresh, refresh_interval, retry_min, retry_max,
// metadata) out of u's query; the OpenFunc takes its own parameters with
// Params and rejects what is left (RejectUnknown). It should do no network
// I/O — connect in Pinger.Ping, which Open calls after validating the
// options — and must not put u's password (or u itself, unredacted) in any
// error.
type OpenFunc func(ctx context.Context, u *url.URL) (Driver, error)

// Register makes a driver available to dlock.Open under scheme. Drivers call
// it from init. It panics if scheme is registered twice or open is nil, as
// database/sql.Register does.
func Register(scheme string, open OpenFunc) {
	registry.Register(registry.Lock, scheme, open, open == nil)
}

// Schemes lists the registered URL schemes, sorted.
func Schemes() []string { return registry.Schemes(registry.Lock) }
