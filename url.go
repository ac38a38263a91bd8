package dlock

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/registry"
)

// Open returns a Locker for a URL such as
//
//	redis://user:pass@127.0.0.1:6379/0?ttl=10s
//
// The scheme picks the driver, which must be linked in (import it, for
// example `import _ "github.com/dlock/dlock/redis"`). The query parameters
// ttl, refresh, refresh_interval, retry_min, retry_max and metadata set the
// Locker's default Options (see OptionsFromQuery); the others are the
// driver's own, and unknown ones are rejected. Bad input is reported before
// any network I/O, as an error matching ErrInvalid. ctx bounds connecting,
// for drivers that connect at once. Credentials in the URL never appear in
// errors: a user name or password holding '/', '?', '#', '%', '[', ']' or a
// space must be percent-encoded (url.QueryEscape), and a URL where it is not
// is refused without quoting it (see driver.ParseURL).
func Open(ctx context.Context, rawURL string) (*Locker, error) {
	u, err := driver.ParseURL(rawURL) // its errors quote nothing of the URL
	if err != nil {
		return nil, err
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("%w: lock URL %q has no scheme; registered: %s", ErrInvalid, driver.RedactURL(u), strings.Join(driver.Schemes(), ", "))
	}
	open, _ := registry.Lookup(registry.Lock, u.Scheme).(driver.OpenFunc)
	if open == nil {
		return nil, fmt.Errorf("%w: no driver for scheme %q (forgotten import?); registered: %s",
			ErrInvalid, u.Scheme, strings.Join(driver.Schemes(), ", "))
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, driver.QueryError(u.Scheme, err)
	}
	defaults, err := OptionsFromQuery(q)
	if err != nil {
		return nil, err
	}
	rest := *u
	rest.RawQuery = q.Encode()
	d, err := open(ctx, &rest)
	if err != nil {
		return nil, driver.RedactError(err, u)
	}
	l, err := New(d, defaults)
	if err != nil {
		_ = d.Close()
		return nil, driver.RedactError(err, u)
	}
	if p, ok := d.(driver.Pinger); ok {
		if err := p.Ping(ctx); err != nil {
			_ = l.Close(context.Background())
			return nil, driver.RedactError(err, u)
		}
	}
	return l, nil
}
