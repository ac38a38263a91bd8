package driver

// The URL toolkit every driver uses the same way: query parameters taken one
// at a time (each at most once), the rest rejected, a URL's password kept out
// of error text, and the tls_* parameters of the secure schemes.

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Params takes single-valued parameters out of a query, deleting each one it
// takes, so that what is left afterwards is unknown to the driver. The first
// problem met is kept in Err. A driver's ParseURL reads like this:
//
//	p := driver.Params{Q: u.Query(), Driver: "redis"}
//	prefix, _ := p.Take("prefix")
//	compat, _ := p.TakeBool("compat")
//	tlsp := p.TakeTLS()
//	if err := p.Done(); err != nil { // the first problem, or unknown parameters
//		return nil, nil, err
//	}
type Params struct {
	Q      url.Values
	Driver string // names the driver in errors: "redis", "etcd", …
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

// Fail records err unless an earlier problem was recorded.
func (p *Params) Fail(err error) {
	if p.Err == nil {
		p.Err = err
	}
}
