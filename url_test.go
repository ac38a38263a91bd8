package dlock_test

import (
	"context"
	"errors"
	"log"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	_ "github.com/dlock/dlock/etcd"
	_ "github.com/dlock/dlock/memory"
	_ "github.com/dlock/dlock/postgres"
	"github.com/dlock/dlock/queue"
	_ "github.com/dlock/dlock/redis"
	_ "github.com/dlock/dlock/redlock"
	_ "github.com/dlock/dlock/zookeeper"
)

// The two halves of the test password: neither may appear in any error or
// log line, whatever the URL does to the password around them.
const (
	secretHead = "S3cretHd"
	secretTail = "Ta1lPart"
)

// A password pasted into a lock URL unescaped, on every registered scheme:
// Open fails (before any I/O when the URL is malformed) and no error in the
// chain, and no log line, repeats any part of the password.
func TestOpenKeepsPasswordOut(t *testing.T) {
	malformed := []struct {
		userinfo string
		want     string // in the error
	}{
		// net/url quotes the text after the ':' as the port.
		{"user:" + secretHead + "/" + secretTail, "invalid port"},
		{"user:" + secretHead + "#" + secretTail, "invalid port"},
		{"user:" + secretHead + "?" + secretTail, "invalid port"},
		{":" + secretHead + "/" + secretTail, "invalid port"},
		{"user:" + secretHead + "/" + secretTail + ":x", "invalid port"},
		// ... the bad escape as such.
		{"user:" + secretHead + "%zz" + secretTail, "escape"},
		{"user:" + secretHead + "%" + secretTail, "escape"},
		{"user:" + secretHead + "%2" + secretTail, "escape"},
		{"us%zzer:" + secretHead, "escape"},
		// ... nothing, for these.
		{"user:" + secretHead + " " + secretTail, "userinfo"},
		{"user:" + secretHead + "[" + secretTail, "userinfo"},
		{"user:" + secretHead + "\n" + secretTail, "control"},
		{"user:" + secretHead + "\x7f" + secretTail, "control"},
		// These parse, but not as the user meant: the part before the '/',
		// '?' or '#' becomes the host (and port), the rest the path, query or
		// fragment, where a driver would quote it.
		{secretHead + "/" + secretTail, "'@'"},
		{"user:0357/" + secretTail, "'@'"},
		{"user:0357?" + secretTail, "'@'"},
		{"user:0357#" + secretTail, "'@'"},
		{":/" + secretTail, "'@'"},
		{"user:" + secretHead + "@x/" + secretTail, "'@'"},
	}
	// '@' and ':' in a password are unambiguous: these URLs are valid, and
	// fail connecting to a closed port.
	valid := []string{
		"user:" + secretHead + "@" + secretTail,
		"user:" + secretHead + ":" + secretTail,
		"user:" + secretHead + "%2F" + secretTail,
	}
	hosts := func(scheme string) string {
		if strings.HasPrefix(scheme, "redlock") {
			return "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
		}
		return "127.0.0.1:1"
	}
	logs := captureLogs(t)
	check := func(t *testing.T, what string, err error) {
		t.Helper()
		for _, e := range errorChain(err) {
			for _, s := range []string{secretHead, secretTail, "0357"} {
				if strings.Contains(e.Error(), s) {
					t.Errorf("%s: error %q contains %q of the password", what, e, s)
				}
			}
		}
	}
	schemes := driver.Schemes()
	if len(schemes) < 10 {
		t.Fatalf("registered schemes %v: want every driver's", schemes)
	}
	for _, scheme := range schemes {
		t.Run(scheme, func(t *testing.T) {
			for _, tc := range malformed {
				raw := scheme + "://" + tc.userinfo + "@" + hosts(scheme) + "/?ttl=5s"
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				start := time.Now()
				l, err := dlock.Open(ctx, raw)
				elapsed := time.Since(start)
				cancel()
				if err == nil {
					_ = l.Close(context.Background())
					t.Errorf("Open(%q) succeeded", raw)
					continue
				}
				if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Open(%q): %v; want ErrInvalid saying %q", raw, err, tc.want)
				}
				if elapsed > time.Second {
					t.Errorf("Open(%q) took %v: I/O before rejecting it", raw, elapsed)
				}
				check(t, "Open("+tc.userinfo+")", err)
			}
			for _, userinfo := range valid {
				raw := scheme + "://" + userinfo + "@" + hosts(scheme) + "/?ttl=5s"
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				l, err := dlock.Open(ctx, raw)
				cancel()
				if err == nil {
					_ = l.Close(context.Background())
					t.Errorf("Open(%q) succeeded on a closed port", raw)
					continue
				}
				check(t, "Open("+userinfo+")", err)
			}
		})
	}
	// queue.Open shares the URL path.
	for _, scheme := range []string{"redis", "postgres", "mem"} {
		for _, tc := range malformed {
			c, err := queue.Open(context.Background(), scheme+"://"+tc.userinfo+"@127.0.0.1:1/")
			if err == nil {
				_ = c.Close()
			}
			if !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("queue.Open(%s://%q@…): %v; want ErrInvalid", scheme, tc.userinfo, err)
			}
			check(t, "queue.Open("+tc.userinfo+")", err)
		}
	}
	for _, s := range []string{secretHead, secretTail, "0357"} {
		if strings.Contains(logs.String(), s) {
			t.Errorf("the log contains %q of the password:\n%s", s, logs)
		}
	}
}

// errorChain returns err and every error it wraps.
func errorChain(err error) []error {
	if err == nil {
		return nil
	}
	out := []error{err}
	switch w := err.(type) {
	case interface{ Unwrap() error }:
		out = append(out, errorChain(w.Unwrap())...)
	case interface{ Unwrap() []error }:
		for _, e := range w.Unwrap() {
			out = append(out, errorChain(e)...)
		}
	}
	return out
}

// captureLogs sends the standard logger's and slog's default output to a
// buffer until the test ends.
func captureLogs(t *testing.T) *syncBuffer {
	buf := &syncBuffer{}
	w, flags, def := log.Writer(), log.Flags(), slog.Default()
	log.SetOutput(buf)
	slog.SetDefault(slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() {
		slog.SetDefault(def)
		log.SetOutput(w)
		log.SetFlags(flags)
	})
	return buf
}
