// Package urlparams is the URL handling the drivers share: query parameters
// taken one at a time (each at most once), and a URL's password kept out of
// error text.
package urlparams

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// Params takes single-valued parameters out of a query, deleting each one it
// takes, so that what is left afterwards is unknown to the driver. The first
// problem met is kept in Err.
type Params struct {
	Q      url.Values
	Driver string // names the driver in errors: "redis", "etcd", …
	Err    error  // the first problem met, matching dlock.ErrInvalid
	TLS    bool   // a tls_ parameter was taken
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

// RedactText replaces u's password, in every spelling it may take, with
// "xxxxx".
func RedactText(s string, u *url.URL) string {
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

// Redact returns err itself when its text does not contain u's password,
// and otherwise an error with the password replaced, which drops err from
// the chain so that nothing can print it.
func Redact(err error, u *url.URL) error {
	msg := err.Error()
	if clean := RedactText(msg, u); clean != msg {
		return errors.New(clean)
	}
	return err
}
