package dlock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	secret := "s3cr3t-pa55"
	cases := []struct {
		url  string
		want string // in the error
	}{
		{"nosuch://user:" + secret + "@host/x", "forgotten import?"},
		{"mem://x?ttl=abc", "ttl"},
		{"mem://x?bogus=1&password=" + secret, "bogus"},
		{"mem://x?ttl=-1s", "ttl"},
		{"mem://x?ttl=1s&refresh_interval=2s", "refresh interval"},
		{"mem://x?ttl=1s&ttl=2s", "2 times"},
		{"://user:" + secret + "@host", "malformed"},
		{"mem://user:" + secret + "@x/path", "mem URLs"},
		{"localhost:6379", "no driver"},
	}
	for _, tc := range cases {
		l, err := dlock.Open(ctx, tc.url)
		if err == nil {
			l.Close(ctx)
			t.Errorf("Open(%q): got nil error", tc.url)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q): got %v, want ErrInvalid", tc.url, err)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): error %q does not mention %q", tc.url, err, tc.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q): error leaks the password: %q", tc.url, err)
		}
	}
	_, err := dlock.Open(ctx, "nosuch://h")
	if !strings.Contains(err.Error(), "mem") {
		t.Errorf("unknown scheme error %q does not list the registered schemes", err)
	}
}

func TestOpenDefaults(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://defaults?ttl=2s&refresh=false&metadata=host-a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	ls, err := l.Acquire(ctx, "n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := ls.TTL(); got != 2*time.Second {
		t.Errorf("TTL() = %v, want 2s from the URL", got)
	}
	if _, meta, _ := memory.NamedStore("defaults").Holder("n"); meta != "host-a" {
		t.Errorf("metadata = %q, want host-a", meta)
	}
	// Per-acquire options override the URL's.
	ls2, err := l.Acquire(ctx, "m", &dlock.Options{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := ls2.TTL(); got != 3*time.Second {
		t.Errorf("TTL() = %v, want 3s", got)
	}
}

func TestRedact(t *testing.T) {
	u, _ := url.Parse("redis://user:pw@h:1/0?ttl=1s&tls_key_password=x&password=y")
	got := driver.RedactURL(u)
	r, _ := url.Parse(got)
	if strings.Contains(got, "pw@") || r.Query().Get("tls_key_password") == "x" || r.Query().Get("password") == "y" {
		t.Errorf("Redact = %q leaks a secret", got)
	}
	if !strings.Contains(got, "ttl=1s") || !strings.Contains(got, "user:") {
		t.Errorf("Redact = %q lost harmless parts", got)
	}
}

func TestOptionsQueryRoundTrip(t *testing.T) {
	o := &dlock.Options{TTL: 7 * time.Second, NoRefresh: true, RefreshInterval: time.Second,
		RetryMin: time.Millisecond, RetryMax: 2 * time.Second, Metadata: "m",
		MaxHold: time.Minute, HeartbeatTimeout: 3 * time.Second}
	q := o.Query()
	got, err := dlock.OptionsFromQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	if *got != *o {
		t.Errorf("round trip: got %+v, want %+v", *got, *o)
	}
	if len(q) != 0 {
		t.Errorf("OptionsFromQuery left %v", q)
	}
}

func TestDoReportsLoss(t *testing.T) {
	ctx := context.Background()
	link := memory.NewLink()
	l, err := memory.New(memory.NewStore(), &memory.Options{Link: link})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	var got *dlock.Lease
	err = dlock.Do(ctx, l, "x", &dlock.Options{TTL: 100 * time.Millisecond}, func(ctx context.Context, lease *dlock.Lease) error {
		got = lease
		link.Blackhole() // the watchdog cannot refresh: the lease is lost at ValidUntil
		<-ctx.Done()
		link.Heal()
		return ctx.Err()
	})
	if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Do: got %v, want ErrLost and the work's context.Canceled", err)
	}
	if got == nil || !errors.Is(got.Err(), dlock.ErrLost) {
		t.Fatalf("Do's fn got lease %v; want the lease, ended with ErrLost", got)
	}
}

func TestNewRejectsBadDefaults(t *testing.T) {
	_, err := memory.New(memory.NewStore(), &memory.Options{Defaults: dlock.Options{TTL: time.Second, RefreshInterval: 2 * time.Second}})
	if !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
}

// A caller of Held, Refresh or Release that waits behind a watchdog refresh
// stuck in a partition gives up when its own ctx ends, not at ValidUntil;
// the lease is still valid and can be released once the network heals.
func TestCallsBehindStuckRefreshEndWithCtx(t *testing.T) {
	ctx := context.Background()
	link := memory.NewLink()
	l, err := memory.New(memory.NewStore(), &memory.Options{Link: link})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	ls, err := l.TryAcquire(ctx, "x", &dlock.Options{TTL: 3 * time.Second, RefreshInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	link.Blackhole()
	// No event marks the refresh as sent: 200ms is four refresh intervals,
	// and a refresh sent into the hole waits there until ValidUntil (~3s).
	time.Sleep(200 * time.Millisecond)
	for _, op := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"Held", func(ctx context.Context) error { _, err := ls.Held(ctx); return err }},
		{"Refresh", func(ctx context.Context) error { return ls.Refresh(ctx, 0) }},
		{"Release", func(ctx context.Context) error { return ls.Release(ctx) }},
	} {
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		start := time.Now()
		err := op.fn(cctx)
		cancel()
		// Tolerance: 100ms ctx + 900ms of scheduling slack, still well before ValidUntil.
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
			t.Errorf("%s behind a stuck refresh: %v after %v; want DeadlineExceeded after ~100ms", op.name, err, time.Since(start))
		}
	}
	if ls.Err() != nil {
		t.Fatalf("the lease ended: %v", ls.Err())
	}
	link.Heal()
	if err := ls.Release(ctx); err != nil {
		t.Fatalf("Release after the heal: %v", err)
	}
}

// Close ends a wait whose ctx never ends: context.Background() and
// context.TODO() waits run on the Locker's own closing context rather than
// one of their own (see locker.acquire).
func TestCloseEndsBackgroundWaits(t *testing.T) {
	for _, ctx := range []context.Context{context.Background(), context.TODO()} {
		store := memory.NewStore()
		l, err := memory.New(store, nil)
		if err != nil {
			t.Fatal(err)
		}
		held, err := l.TryAcquire(ctx, "x", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			_, err := l.Acquire(ctx, "x", nil)
			got <- err
		}()
		for store.Watchers("x") == 0 { // the waiter waits for a release
			time.Sleep(time.Millisecond)
		}
		closed := make(chan error, 1)
		go func() { closed <- l.Close(context.Background()) }()
		select {
		case err := <-got:
			if !errors.Is(err, dlock.ErrClosed) || !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("%v: wait ended by Close: got %v, want ErrClosed and ErrNotAcquired", ctx, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%v: Close did not end the wait within 5s", ctx)
		}
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if held.Err() == nil {
			t.Errorf("%v: the held lease did not end with Close", ctx)
		}
	}
}
