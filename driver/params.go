package driver

// The URL toolkit every driver uses the same way: query parameters taken one
// at a time (each at most once; booleans and durations parsed alike), the
// rest rejected, a host list read alike, and the tls_* parameters of the
// secure schemes (tls.go). Parsing a URL and keeping its password out of
// error text is in url.go. Each driver's ParseURL still reads top-down as
// its own URL's grammar (scheme, form, query, lock options, its parameters,
// then its client's): what the drivers repeat is that order of calls, which
// the duplicate finder sees as one shape, not logic to share.

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Params takes single-valued parameters out of a query, deleting each one it
// takes, so that what is left afterwards is unknown to the driver. The first
// problem met is kept in Err. A driver's ParseURL reads like this:
//
//	p := driver.Params{Q: u.Query(), Driver: "redis"}
//	prefix, _ := p.Take("prefix")
//	compat, _ := p.TakeBool("compat")
//	timeout, _ := p.TakeDuration("node_timeout")
//	hosts := p.Hosts(u.Host, "6379")
//	tlsp := p.TakeTLS()
//	if err := p.Done(); err != nil { // the first problem, or unknown parameters
//		return nil, nil, err
//	}
type Params struct {
	Q      url.Values
	Driver string // names the driver in errors: "redis", "etcd", … ("" for none)
	Err    error  // the first problem met, matching ErrInvalid
	TLS    bool   // a tls_ parameter was taken
}

// Done returns the first problem met, or else an ErrInvalid error naming the
// parameters nobody took (see RejectUnknown), or nil.
func (p *Params) Done() error {
	if p.Err != nil {
		return p.Err
	}
	if err := RejectUnknown(p.Q); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrInvalid, p.Driver, strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
	}
	return nil
}

// RejectUnknown returns an ErrInvalid error naming the keys left in q, or nil.
func RejectUnknown(q url.Values) error {
	if len(q) == 0 {
		return nil
	}
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return fmt.Errorf("%w: unknown URL parameter(s) %v", ErrInvalid, keys)
}

// Take removes key from the query and returns its value, if it was given.
// A key given more than once is an error (in Err), and reported as absent.
func (p *Params) Take(key string) (string, bool) {
	vals, ok := p.Q[key]
	if !ok {
		return "", false
	}
	delete(p.Q, key)
	if strings.HasPrefix(key, "tls_") {
		p.TLS = true
	}
	if len(vals) != 1 {
		p.Fail(p.invalid("URL parameter %q given %d times", key, len(vals)))
		return "", false
	}
	return vals[0], true
}

// TakeBool is Take for a boolean (strconv.ParseBool's forms). A value that
// is not one is an error (in Err), and reported as absent.
func (p *Params) TakeBool(key string) (value, ok bool) {
	v, ok := p.Take(key)
	if !ok {
		return false, false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.Fail(p.invalid("URL parameter %s=%q is not a boolean", key, v))
		return false, false
	}
	return b, true
}

// TakeDuration is Take for a positive duration (time.ParseDuration's
// forms). A value that is not one is an error (in Err), and reported as
// absent.
func (p *Params) TakeDuration(key string) (time.Duration, bool) {
	v, ok := p.Take(key)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		p.Fail(p.invalid("URL parameter %s=%q is not a positive duration", key, v))
		return 0, false
	}
	return d, true
}

// Hosts splits a URL's comma-separated host list ("h1:2379,h2,[::1]:2380")
// into host:port addresses, giving defaultPort to a host written without
// one. An empty entry, an entry with no host name or that is not
// host[:port], a port outside 1–65535, and an address listed twice are
// errors (in Err, and Hosts returns nil).
func (p *Params) Hosts(list, defaultPort string) []string {
	var addrs []string
	for _, h := range strings.Split(list, ",") {
		var host, port string
		switch {
		case h == "":
			p.Fail(p.invalid("empty entry in the host list %q", list))
			return nil
		case strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]"): // [IPv6]
			host, port = h[1:len(h)-1], defaultPort
		case !strings.Contains(h, ":"):
			host, port = h, defaultPort
		default:
			var err error
			if host, port, err = net.SplitHostPort(h); err != nil {
				p.Fail(p.invalid("host %q is not host[:port]", h))
				return nil
			}
		}
		if host == "" {
			p.Fail(p.invalid("host %q has no name", h))
			return nil
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			p.Fail(p.invalid("host %q has a bad port", h))
			return nil
		}
		addr := net.JoinHostPort(host, port)
		if slices.Contains(addrs, addr) {
			p.Fail(p.invalid("host %s listed twice", addr))
			return nil
		}
		addrs = append(addrs, addr)
	}
	return addrs
}

// Fail records err unless an earlier problem was recorded.
func (p *Params) Fail(err error) {
	if p.Err == nil {
		p.Err = err
	}
}
