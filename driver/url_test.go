package driver_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// ParseURL refuses a URL whose userinfo net/url cannot see whole, and says
// why without quoting any of it; it accepts what parses unambiguously.
func TestParseURL(t *testing.T) {
	const pw = "Pa55w0rd"
	for _, tc := range []struct {
		raw  string
		want string // in the error; "" for none
	}{
		{"redis://u:" + pw + "/x@h:1/0", "invalid port after host (percent-encode"},
		{"redis://u:" + pw + "%zz@h:1/0", "invalid URL escape (percent-encode"},
		{"redis://u:" + pw + "@h%zz:1/0", "invalid URL escape"},
		{"redis://u:" + pw + "@h h:1/0", "invalid character in host name"},
		{"redis://u:" + pw + " x@h:1/0", "invalid userinfo"},
		{"redis://u:1234/" + pw + "@h:1/0", "an '@' in its path"},
		{"redis://u:1234?" + pw + "@h:1/0", "an '@' in its query"},
		{"redis://u:1234#" + pw + "@h:1/0", "an '@' in its fragment"},
		{"redis://u:" + pw + "@h:1/0?metadata=me@host", ""},
		{"redis://u:" + pw + "@h:1/0?ttl=1s#frag", ""},
		{"redis://u:p@" + pw + "@h:1/0", ""},
		{"redis://u:p:" + pw + "@h:1/0", ""},
		{"etcd://u:p%2F" + pw + "@h:1/pre%40fix", ""},
		{"mem://name", ""},
		{"redis:opaque@x", ""},
	} {
		u, err := driver.ParseURL(tc.raw)
		if tc.want == "" {
			if err != nil || u == nil {
				t.Errorf("ParseURL(%q): %v; want a URL", tc.raw, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseURL(%q): %v; want ErrInvalid saying %q", tc.raw, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), "1234") || strings.Contains(err.Error(), `"`) {
			t.Errorf("ParseURL(%q): error %q quotes the URL", tc.raw, err)
		}
	}
	if u, err := driver.ParseURL("redis://u:p%40ss@h:1"); err != nil || u.User.String() != "u:p%40ss" {
		t.Errorf("ParseURL with an encoded password: %v, %v", u, err)
	}
}

// RedactText replaces the password in the userinfo, and elsewhere only when
// the URL shows its text nowhere else: a password that is also the scheme,
// user or database name leaves those alone.
func TestRedactUserinfo(t *testing.T) {
	u, _ := url.Parse("postgres://postgres:postgres@db:5432/postgres")
	in := "postgres: connecting to postgres://postgres:postgres@db:5432/postgres: password authentication failed for user postgres"
	want := "postgres: connecting to postgres://postgres:xxxxx@db:5432/postgres: password authentication failed for user postgres"
	if got := driver.RedactText(in, u); got != want {
		t.Errorf("RedactText:\n got %q\nwant %q", got, want)
	}
	if got := driver.RedactText("connecting to "+driver.RedactURL(u), u); strings.Contains(got, "xxxxx://") || !strings.Contains(got, "postgres://postgres:xxxxx@db") {
		t.Errorf("RedactText of a redacted URL = %q", got)
	}

	u, _ = url.Parse("redis://user:s%2Fcr3t@h:1/0")
	for _, s := range []string{"auth s/cr3t refused", "redis://user:s%2Fcr3t@h:1/0"} {
		if got := driver.RedactText(s, u); strings.Contains(strings.ToLower(got), "cr3t") {
			t.Errorf("RedactText(%q) = %q keeps the password", s, got)
		}
	}
}

// A redacted error still matches what the original matched, and does not
// unwrap to it.
func TestRedactErrorMatches(t *testing.T) {
	u, _ := url.Parse("redis://user:s3cr3tpw@h:1/0")
	orig := errors.Join(dlock.ErrInvalid, errors.New("auth s3cr3tpw refused"))
	got := driver.RedactError(orig, u)
	if !errors.Is(got, dlock.ErrInvalid) || strings.Contains(got.Error(), "s3cr3tpw") {
		t.Errorf("RedactError = %q; want ErrInvalid without the password", got)
	}
	if errors.Unwrap(got) != nil {
		t.Errorf("RedactError unwraps to %v", errors.Unwrap(got))
	}
	if driver.RedactError(nil, u) != nil {
		t.Error("RedactError(nil) != nil")
	}
}
