package dlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// OpenFunc opens a Locker from a parsed URL. Drivers register one per
// scheme. It must not put u's password (or u itself, unredacted) in any error.
type OpenFunc func(ctx context.Context, u *url.URL) (Locker, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]OpenFunc{}
)

// Register makes a driver available to Open under scheme. Drivers call it
// from init. It panics if scheme is registered twice or open is nil, as
// database/sql.Register does.
func Register(scheme string, open OpenFunc) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if open == nil {
		panic("dlock: Register of a nil OpenFunc for " + scheme)
	}
	if _, dup := registry[scheme]; dup {
		panic("dlock: Register called twice for scheme " + scheme)
	}
	registry[scheme] = open
}

// Schemes lists the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s := make([]string, 0, len(registry))
	for k := range registry {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

// Open returns a Locker for a URL such as
//
//	redis://user:pass@127.0.0.1:6379/0?ttl=10s
//
// The scheme picks the driver, which must be linked in (import it, for
// example `import _ "github.com/dlock/dlock/redis"`). Query parameters set
// the Locker's default Options (see Options for their names) and the
// driver's own settings; unknown parameters are rejected. Credentials in the
// URL never appear in errors. ctx bounds connecting, where the driver
// connects at once.
func Open(ctx context.Context, rawURL string) (Locker, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error repeats the whole URL, password included: keep only the
		// reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: malformed lock URL: %v", ErrInvalid, err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("%w: lock URL %q has no scheme; registered: %s", ErrInvalid, Redact(u), strings.Join(Schemes(), ", "))
	}
	registryMu.RLock()
	open := registry[u.Scheme]
	registryMu.RUnlock()
	if open == nil {
		return nil, fmt.Errorf("%w: no driver for scheme %q (forgotten import?); registered: %s",
			ErrInvalid, u.Scheme, strings.Join(Schemes(), ", "))
	}
	return open(ctx, u)
}

// Redact returns u as a string with any password, and the values of query
// parameters whose names suggest secrets, replaced by "xxxxx".
func Redact(u *url.URL) string {
	if u == nil {
		return ""
	}
	cp := *u
	if cp.User != nil {
		if _, ok := cp.User.Password(); ok {
			cp.User = url.UserPassword(cp.User.Username(), "xxxxx")
		}
	}
	q := cp.Query()
	changed := false
	for k := range q {
		lk := strings.ToLower(k)
		if strings.Contains(lk, "pass") || strings.Contains(lk, "secret") || strings.Contains(lk, "token") || strings.Contains(lk, "key") && !strings.Contains(lk, "keepalive") {
			q.Set(k, "xxxxx")
			changed = true
		}
	}
	if changed {
		cp.RawQuery = q.Encode()
	}
	return cp.String()
}
