package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/dlock/dlock"
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
		return nil, fmt.Errorf("redis: connecting to %s: %w", dlock.Redact(u), redact(err, u))
	}
	return l, nil
}

// Parameters this package takes out of a URL before go-redis sees it.
const (
	paramPrefix    = "prefix"
	paramCompat    = "compat"
	paramTLSCA     = "tls_ca"
	paramTLSCert   = "tls_cert"
	paramTLSKey    = "tls_key"
	paramTLSServer = "tls_server_name"
	paramTLSSkip   = "tls_insecure_skip_verify"
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
		return nil, nil, invalid("malformed query: %v", redactText(err.Error(), u))
	}
	lock, err := dlock.OptionsFromQuery(q)
	if err != nil {
		return nil, nil, err
	}
	opts := &Options{Lock: *lock}
	p := params{q: q}
	if v, ok := p.take(paramPrefix); ok {
		opts.KeyPrefix = v
	}
	if v, ok := p.take(paramCompat); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			p.fail(invalid("URL parameter %s=%q is not a boolean", paramCompat, v))
		}
		opts.Compat = b
	}
	ca, _ := p.take(paramTLSCA)
	cert, _ := p.take(paramTLSCert)
	key, _ := p.take(paramTLSKey)
	server, _ := p.take(paramTLSServer)
	skip := false
	if v, ok := p.take(paramTLSSkip); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			p.fail(invalid("URL parameter %s=%q is not a boolean", paramTLSSkip, v))
		}
		skip = b
	}
	if p.err != nil {
		return nil, nil, p.err
	}
	if u.Scheme != "rediss" && p.tls {
		return nil, nil, invalid("TLS parameters need a rediss:// URL")
	}
	if (cert == "") != (key == "") {
		return nil, nil, invalid("%s and %s go together", paramTLSCert, paramTLSKey)
	}

	rest := *u
	rest.RawQuery = q.Encode()
	gopts, err := goredis.ParseURL(rest.String())
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the whole URL
		}
		return nil, nil, invalid("%s", strings.TrimPrefix(redactText(err.Error(), u), "redis: "))
	}
	gopts.ContextTimeoutEnabled = true
	if u.Scheme == "rediss" {
		cfg := gopts.TLSConfig // ServerName: the host, MinVersion: TLS 1.2, skip_verify
		if ca != "" {
			pem, err := os.ReadFile(ca)
			if err != nil {
				return nil, nil, invalid("%s: %v", paramTLSCA, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, nil, invalid("%s: no PEM certificate in %s", paramTLSCA, ca)
			}
			cfg.RootCAs = pool
		}
		if cert != "" {
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return nil, nil, invalid("%s/%s: %v", paramTLSCert, paramTLSKey, err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		if server != "" {
			cfg.ServerName = server
		}
		if skip {
			cfg.InsecureSkipVerify = true
		}
	}
	return gopts, opts, nil
}

// params takes single-valued parameters out of a query.
type params struct {
	q   url.Values
	err error
	tls bool // a tls_ parameter was given
}

func (p *params) take(key string) (string, bool) {
	vals, ok := p.q[key]
	if !ok {
		return "", false
	}
	delete(p.q, key)
	if strings.HasPrefix(key, "tls_") {
		p.tls = true
	}
	if len(vals) != 1 {
		p.fail(invalid("URL parameter %q given %d times", key, len(vals)))
		return "", false
	}
	return vals[0], true
}

func (p *params) fail(err error) {
	if p.err == nil {
		p.err = err
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: redis: %s", dlock.ErrInvalid, fmt.Sprintf(format, args...))
}

// redactText replaces u's password, in every spelling it may take, with
// "xxxxx".
func redactText(s string, u *url.URL) string {
	if u == nil || u.User == nil {
		return s
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		return s
	}
	for _, form := range []string{pw, url.PathEscape(pw), url.QueryEscape(pw), url.UserPassword("", pw).String()[1:]} {
		if form != "" {
			s = strings.ReplaceAll(s, form, "xxxxx")
		}
	}
	return s
}

// redact returns err itself when its text does not contain u's password,
// and otherwise an error with the password replaced, which drops err from
// the chain so that nothing can print it.
func redact(err error, u *url.URL) error {
	msg := err.Error()
	if clean := redactText(msg, u); clean != msg {
		return errors.New(clean)
	}
	return err
}
