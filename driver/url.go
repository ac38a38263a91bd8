package driver

// A lock URL parsed so that no error repeats any part of its userinfo, and
// the userinfo's password kept out of error text afterwards.

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ParseURL parses a lock or queue URL as dlock.Open does. Every error
// matches ErrInvalid, says what is wrong, and quotes no part of the URL:
// net/url's own errors quote text that may be part of a password (a
// password holding a '/', '?' or '#' makes the rest of it the "port", the
// path, the query or the fragment), so their quoted parts are dropped. A
// URL that parses but has an '@' in its path, fragment or a query
// parameter's name is refused too: that '@' ends a userinfo the parser did
// not see, and the password's pieces would otherwise travel as the host,
// the database or an unknown parameter into later errors. (An '@' in a
// query value, as in metadata=me@host, is allowed.)
func ParseURL(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: malformed URL: %s%s", ErrInvalid, parseReason(err), encodeHint(rawURL))
	}
	if where := strayAt(rawURL, u); where != "" {
		return nil, fmt.Errorf("%w: malformed URL: an '@' in its %s: percent-encode any '/', '?', '#', '@' or '%%' "+
			"in the user name or password (url.QueryEscape), and an '@' elsewhere as %%40", ErrInvalid, where)
	}
	return u, nil
}

// parseReason is url.Parse's reason for err without the URL and without any
// text it quotes from it.
func parseReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var esc url.EscapeError
	var host url.InvalidHostError
	switch {
	case errors.As(err, &esc):
		return "invalid URL escape"
	case errors.As(err, &host):
		return "invalid character in host name"
	}
	return dropQuoted(err.Error())
}

// dropQuoted removes the double-quoted (strconv.Quote) parts of s, and what
// follows an unterminated quote.
func dropQuoted(s string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(strings.TrimRight(s[:i], " "))
		s = s[i+1:]
		end := -1
		for j := 0; j < len(s); j++ {
			if s[j] == '\\' {
				j++
			} else if s[j] == '"' {
				end = j
				break
			}
		}
		if end < 0 {
			break
		}
		s = s[end+1:]
	}
	return strings.TrimSpace(b.String())
}

// encodeHint is a hint to percent-encode the userinfo when the text before
// the URL's last '@' holds a character that must be encoded there.
func encodeHint(rawURL string) string {
	_, rest, ok := strings.Cut(rawURL, "//")
	if !ok {
		return ""
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 || !strings.ContainsFunc(rest[:at], func(r rune) bool {
		return strings.ContainsRune("/?#%[] ", r) || r < ' ' || r == 0x7f
	}) {
		return ""
	}
	return " (percent-encode any '/', '?', '#', '%', '[', ']' or space in the user name or password: url.QueryEscape)"
}

// strayAt names the part of a URL that parsed as u where an '@' points to a
// userinfo the parser did not see ("path", "query" or "fragment"), or "".
func strayAt(rawURL string, u *url.URL) string {
	rest := rawURL
	if u.Scheme != "" {
		rest = rest[len(u.Scheme)+1:]
	}
	if !strings.HasPrefix(rest, "//") {
		return "" // no authority: nothing to mistake
	}
	rest = rest[2:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		return ""
	}
	rest, frag, _ := strings.Cut(rest[end:], "#")
	path, query, _ := strings.Cut(rest, "?")
	switch {
	case strings.Contains(path, "@"):
		return "path"
	case strings.Contains(frag, "@"):
		return "fragment"
	}
	for _, kv := range strings.Split(query, "&") {
		if k, _, _ := strings.Cut(kv, "="); strings.Contains(k, "@") {
			return "query"
		}
	}
	return ""
}

// QueryError is the reason url.ParseQuery gave for err, as an ErrInvalid
// error naming the driver, without the text it quotes from the query (which
// may be a secret parameter's value).
func QueryError(driver string, err error) error {
	return invalid(driver, "malformed query: %s", parseReason(err))
}

// RedactText replaces u's password, in every spelling it may take, with
// "xxxxx" where it stands in a URL's userinfo (":password@"). Elsewhere in s
// the password's text is replaced only when u does not show that text in
// one of its other parts: a password "postgres" leaves "postgres://" alone.
func RedactText(s string, u *url.URL) string {
	if u == nil || u.User == nil {
		return s
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		return s
	}
	forms := []string{pw, url.PathEscape(pw), url.QueryEscape(pw), url.UserPassword("", pw).String()[1:]}
	for _, f := range forms {
		s = strings.ReplaceAll(s, ":"+f+"@", ":xxxxx@")
	}
	pub := *u
	pub.User = url.User(u.User.Username())
	public := strings.Join([]string{pub.String(), u.User.Username(), u.Host, u.Path, u.Fragment, u.Query().Encode()}, " ")
	if q, err := url.QueryUnescape(u.RawQuery); err == nil {
		public += " " + q
	}
	for _, f := range forms {
		if !strings.Contains(public, f) {
			s = strings.ReplaceAll(s, f, "xxxxx")
		}
	}
	return s
}

// RedactError returns err itself when its text does not contain u's
// password (see RedactText), and otherwise an error with the password
// replaced. That error matches (errors.Is) what err matched, but does not
// unwrap to err, so that nothing can print err's text.
func RedactError(err error, u *url.URL) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if clean := RedactText(msg, u); clean != msg {
		return &redactedError{msg: clean, err: err}
	}
	return err
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string        { return e.msg }
func (e *redactedError) Is(target error) bool { return errors.Is(e.err, target) }

// RedactURL returns u as a string with any password, and the values of query
// parameters whose names suggest secrets, replaced by "xxxxx".
func RedactURL(u *url.URL) string {
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
