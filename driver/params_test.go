package driver_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTake(t *testing.T) {
	q, _ := url.ParseQuery("a=1&b=2&b=3&tls_ca=x&left=over")
	p := driver.Params{Q: q, Driver: "test"}
	if v, ok := p.Take("a"); !ok || v != "1" {
		t.Errorf("Take(a) = %q, %v; want 1, true", v, ok)
	}
	if _, ok := p.Take("missing"); ok || p.Err != nil {
		t.Errorf("Take(missing) = _, %v with Err %v; want false, nil", ok, p.Err)
	}
	if p.TLS {
		t.Error("TLS set before any tls_ parameter was taken")
	}
	if _, ok := p.Take("b"); ok || !errors.Is(p.Err, dlock.ErrInvalid) || !strings.Contains(p.Err.Error(), "test:") {
		t.Errorf("Take(b given twice) = _, %v with Err %v; want false and an ErrInvalid naming the driver", ok, p.Err)
	}
	first := p.Err
	p.Take("tls_ca")
	if !p.TLS {
		t.Error("TLS not set after tls_ca was taken")
	}
	p.Fail(errors.New("later"))
	if p.Err != first {
		t.Errorf("Fail replaced the first error %v with %v", first, p.Err)
	}
	if len(p.Q) != 1 || p.Q.Get("left") != "over" {
		t.Errorf("left in the query: %v; want only left=over", p.Q)
	}
}

func TestRedact(t *testing.T) {
	u, err := url.Parse("redis://user:p%40ss%2Fw+rd@host:6379/0")
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password() // p@ss/w+rd
	for _, s := range []string{pw, url.PathEscape(pw), url.QueryEscape(pw), "p%40ss%2Fw+rd"} {
		if got := driver.RedactText("dial "+s+" failed", u); strings.Contains(got, s) {
			t.Errorf("RedactText left %q in %q", s, got)
		}
	}
	plain := errors.New("no secret here")
	if got := driver.RedactError(plain, u); got != plain {
		t.Errorf("Redact changed an error without the password: %v", got)
	}
	if got := driver.RedactError(errors.New("auth p@ss/w+rd refused"), u); strings.Contains(got.Error(), pw) {
		t.Errorf("Redact kept the password: %v", got)
	}
	if got := driver.RedactText("x", &url.URL{Host: "h"}); got != "x" {
		t.Errorf("RedactText without userinfo = %q, want x", got)
	}
}

func TestTakeBool(t *testing.T) {
	q, _ := url.ParseQuery("a=true&b=0&c=maybe")
	p := driver.Params{Q: q, Driver: "test"}
	if v, ok := p.TakeBool("a"); !v || !ok {
		t.Errorf("TakeBool(a=true) = %v, %v", v, ok)
	}
	if v, ok := p.TakeBool("b"); v || !ok {
		t.Errorf("TakeBool(b=0) = %v, %v", v, ok)
	}
	if _, ok := p.TakeBool("missing"); ok || p.Err != nil {
		t.Errorf("TakeBool(missing) = _, %v with Err %v", ok, p.Err)
	}
	if _, ok := p.TakeBool("c"); ok || !errors.Is(p.Err, dlock.ErrInvalid) || !strings.Contains(p.Err.Error(), `c="maybe"`) {
		t.Errorf("TakeBool(c=maybe) = _, %v with Err %v; want absent and an ErrInvalid naming it", ok, p.Err)
	}
}

func TestTakeDuration(t *testing.T) {
	q, _ := url.ParseQuery("a=1500ms&b=0s&c=soon&d=-1s")
	p := driver.Params{Q: q, Driver: "test"}
	if d, ok := p.TakeDuration("a"); d != 1500*time.Millisecond || !ok {
		t.Errorf("TakeDuration(a=1500ms) = %v, %v", d, ok)
	}
	if _, ok := p.TakeDuration("missing"); ok || p.Err != nil {
		t.Errorf("TakeDuration(missing) = _, %v with Err %v", ok, p.Err)
	}
	for _, key := range []string{"b", "c", "d"} {
		p.Err = nil
		if d, ok := p.TakeDuration(key); ok || d != 0 || !errors.Is(p.Err, dlock.ErrInvalid) ||
			!strings.Contains(p.Err.Error(), "test: URL parameter "+key+"=") || !strings.Contains(p.Err.Error(), "positive duration") {
			t.Errorf("TakeDuration(%s=%s) = %v, %v with Err %v; want absent and an ErrInvalid naming it", key, q.Get(key), d, ok, p.Err)
		}
	}
	if len(p.Q) != 0 {
		t.Errorf("left in the query: %v", p.Q)
	}
}

func TestHosts(t *testing.T) {
	for _, tc := range []struct {
		list string
		want string // the addresses, comma-separated; or the error's text
	}{
		{"h1:1,h2,10.0.0.1:3", "h1:1,h2:99,10.0.0.1:3"},
		{"[::1],[::1]:7,[fe80::1]:8", "[::1]:99,[::1]:7,[fe80::1]:8"},
		{"h", "h:99"},
		{"", `empty entry in the host list ""`},
		{"a,,b", `empty entry in the host list "a,,b"`},
		{"a,", `empty entry`},
		{":1", `host ":1" has no name`},
		{"[]", `host "[]" has no name`},
		{"h:", `host "h:" has a bad port`},
		{"h:0", `host "h:0" has a bad port`},
		{"h:65536", `host "h:65536" has a bad port`},
		{"h:port", `host "h:port" has a bad port`},
		{"::1", `host "::1" is not host[:port]`},
		{"h:1:2", `host "h:1:2" is not host[:port]`},
		{"h,h:99", `host h:99 listed twice`},
		{"[::1]:5,[::1]:5", `host [::1]:5 listed twice`},
	} {
		p := driver.Params{Driver: "test"}
		got := p.Hosts(tc.list, "99")
		if strings.Contains(tc.want, " ") { // an error
			if got != nil || !errors.Is(p.Err, dlock.ErrInvalid) || !strings.Contains(p.Err.Error(), "test: "+tc.want) {
				t.Errorf("Hosts(%q) = %q with Err %v; want nil and an ErrInvalid saying %s", tc.list, got, p.Err, tc.want)
			}
			continue
		}
		if p.Err != nil || strings.Join(got, ",") != tc.want {
			t.Errorf("Hosts(%q) = %q with Err %v; want %s", tc.list, got, p.Err, tc.want)
		}
	}
}
