package etcd_test

import (
	"github.com/dlock/dlock/tests/internal/testutil"
	"net/url"
	"os"

	"context"
	"errors"
	"github.com/dlock/dlock/dlocktest"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The layout of the package doc: one key per lease, P N/<token>, holding the
// metadata, bound to an etcd lease of its own; the fence is its create
// revision; names with "/" and "%" are escaped.
func TestLayout(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testutil.Ctx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	for _, tc := range []struct{ name, escaped string }{
		{"plain", "plain"},
		{"a/b%c", "a%2Fb%25c"},
	} {
		ls, err := l.Acquire(ctx, tc.name, &dlock.Options{TTL: 5 * time.Second, Metadata: "host-a"})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := etcd.MutexName(prefix, tc.name), prefix+tc.escaped; got != want {
			t.Errorf("MutexName = %q, want %q", got, want)
		}
		key := prefix + tc.escaped + "/" + ls.Token()
		resp, err := raw.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != key {
			t.Fatalf("keys under the prefix: %v, want just %q", resp.Kvs, key)
		}
		kv := resp.Kvs[0]
		if string(kv.Value) != "host-a" {
			t.Errorf("value %q, want the metadata", kv.Value)
		}
		if f, ok := ls.Fence(); !ok || int64(f) != kv.CreateRevision {
			t.Errorf("Fence() = %d, %v; want the key's create revision %d", f, ok, kv.CreateRevision)
		}
		ttl, err := raw.TimeToLive(ctx, clientv3.LeaseID(kv.Lease), clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		var attached []string // but the Locker's marker (see refreshShared)
		for _, k := range ttl.Keys {
			if !strings.HasPrefix(string(k), prefix+"%marker/") {
				attached = append(attached, string(k))
			}
		}
		if ttl.GrantedTTL != 5 || len(attached) != 1 || attached[0] != key {
			t.Errorf("etcd lease: granted %ds, keys %q; want 5s and just %q", ttl.GrantedTTL, attached, key)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Locks held at once with one TTL share one etcd lease; with another
	// TTL, another one; with LeasePerLock each has its own (the Lockers'
	// Close releases them).
	own := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix, LeasePerLock: true})
	ids := map[string]clientv3.LeaseID{}
	for _, n := range []string{"x", "y", "z"} {
		for _, lk := range []struct {
			name string
			l    *dlock.Locker
			ttl  time.Duration
		}{{"shared", l, 3 * time.Second}, {"shared4", l, 4 * time.Second}, {"own", own, 3 * time.Second}} {
			ls, err := lk.l.Acquire(ctx, lk.name+n, &dlock.Options{TTL: lk.ttl})
			if err != nil {
				t.Fatal(err)
			}
			ids[lk.name+n] = leaseOf(t, ctx, raw, prefix+lk.name+n+"/"+ls.Token())
		}
	}
	if ids["sharedx"] != ids["sharedy"] || ids["sharedx"] != ids["sharedz"] {
		t.Errorf("locks of one TTL on etcd leases %x, %x, %x: want one", ids["sharedx"], ids["sharedy"], ids["sharedz"])
	}
	if ids["shared4x"] != ids["shared4y"] || ids["shared4x"] == ids["sharedx"] {
		t.Errorf("locks of TTL 4s on etcd leases %x, %x (3s: %x): want one of their own", ids["shared4x"], ids["shared4y"], ids["sharedx"])
	}
	if ids["ownx"] == ids["owny"] || ids["ownx"] == ids["sharedx"] {
		t.Errorf("LeasePerLock: etcd leases %x, %x (shared: %x): want one each", ids["ownx"], ids["owny"], ids["sharedx"])
	}
}

// A name and a name below it ("a" and "a/b") are independent locks.
func TestNamesDoNotNest(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testutil.Ctx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	b := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	var held []*dlock.Lease
	for _, n := range []string{"a", "a/b", "a/", "a%2Fb", "a%"} {
		ls, err := a.TryAcquire(ctx, n, nil)
		if err != nil {
			t.Fatalf("TryAcquire(%q) with the others held: %v", n, err)
		}
		held = append(held, ls)
	}
	for _, ls := range held {
		if _, err := b.TryAcquire(ctx, ls.Name(), nil); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire(%q) while held: got %v, want ErrNotAcquired", ls.Name(), err)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// etcd raises a TTL below its minimum (2s by default): the lease reports the
// TTL granted, and ValidUntil follows it.
func TestTTLRaisedIsReported(t *testing.T) {
	if os.Getenv("DLOCK_ETCD_ADDR") != "" {
		t.Skip("needs etcd's default configuration")
	}
	ctx := testutil.Ctx(t)
	srv := dlocktest.RequireNew(t, dlocktest.Etcd) // the default configuration: 2s minimum
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	for _, try := range []bool{true, false} {
		start := time.Now()
		var ls *dlock.Lease
		var err error
		if try {
			ls, err = l.TryAcquire(ctx, "raised", &dlock.Options{TTL: time.Second})
		} else {
			ls, err = l.Acquire(ctx, "raised", &dlock.Options{TTL: 1500 * time.Millisecond})
		}
		returned := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if got := ls.TTL(); got != 2*time.Second {
			t.Errorf("TTL() = %v, want the 2s etcd granted", got)
		}
		// The fresh Locker grants its etcd lease inside the call: ValidUntil
		// is the granted 2s minus the drift margin past the moment the
		// grant was sent, which lies between start and returned however
		// long the scheduler kept either side waiting. Past returned + valid
		// the client would believe in a lock the server may have dropped;
		// before start + valid it counted the 1s or 1.5s asked for.
		valid := 2*time.Second - (2*time.Second)/100 - 2*time.Millisecond
		if lo, hi := start.Add(valid), returned.Add(valid); ls.ValidUntil().Before(lo) || ls.ValidUntil().After(hi) {
			t.Errorf("ValidUntil is %v past start + 2s - drift, %v past return + 2s - drift; want it between the two",
				ls.ValidUntil().Sub(lo), ls.ValidUntil().Sub(hi))
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Refresh to a longer TTL moves the key to a longer etcd lease, keeping its
// create revision; to a shorter one it keeps the etcd lease and reports its
// TTL.
func TestRefreshChangesTTL(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testutil.Ctx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	ls, err := l.Acquire(ctx, "ttl", &dlock.Options{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key := prefix + "ttl/" + ls.Token()
	before := leaseOf(t, ctx, raw, key)
	if err := ls.Refresh(ctx, 7*time.Second); err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != 7*time.Second {
		t.Errorf("TTL() after Refresh(7s) = %v", ls.TTL())
	}
	after := leaseOf(t, ctx, raw, key)
	ttl, err := raw.TimeToLive(ctx, after)
	if err != nil || ttl.GrantedTTL != 7 || after == before {
		t.Errorf("after Refresh(7s): etcd lease %x (was %x) granted %ds, %v", after, before, ttl.GrantedTTL, err)
	}
	if f, _ := ls.Fence(); int64(f) != createRevision(t, ctx, raw, key) {
		t.Error("the key was re-created by the move")
	}
	if err := ls.Refresh(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != 7*time.Second || leaseOf(t, ctx, raw, key) != after {
		t.Errorf("Refresh(3s): TTL() = %v; want the 7s etcd lease kept", ls.TTL())
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A held key deleted, or its etcd lease revoked, behind the holder's back
// is reported lost by the next watchdog refresh, before ValidUntil.
func TestLossDetected(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testutil.Ctx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	for _, how := range []string{"delete", "revoke"} {
		ls, err := l.Acquire(ctx, how, &dlock.Options{TTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		key := prefix + how + "/" + ls.Token()
		if how == "delete" {
			_, err = raw.Delete(ctx, key)
		} else {
			_, err = raw.Revoke(ctx, leaseOf(t, ctx, raw, key))
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-ls.Done():
			if at, until := time.Now(), ls.ValidUntil(); at.After(until) {
				t.Errorf("%s: loss signalled %v after ValidUntil", how, at.Sub(until))
			}
			if !errors.Is(ls.Err(), dlock.ErrLost) {
				t.Errorf("%s: Err() = %v, want ErrLost", how, ls.Err())
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: no loss signal", how)
		}
		if err := ls.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("%s: Release after loss: got %v, want ErrNotHeld", how, err)
		}
	}
}

// With LeasePerLock, released leases' etcd leases are reused by the next acquisitions, and
// Close revokes the idle ones.
func TestIdleLeasesReusedAndRevoked(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testutil.Ctx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l, err := etcd.New(newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix, LeasePerLock: true})
	if err != nil {
		t.Fatal(err)
	}
	var ids []clientv3.LeaseID
	for i := range 3 {
		ls, err := l.TryAcquire(ctx, "reuse", nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, leaseOf(t, ctx, raw, prefix+"reuse/"+ls.Token()))
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if i > 0 && ids[i] != ids[0] {
			t.Errorf("acquisition %d used etcd lease %x, want the idle %x", i, ids[i], ids[0])
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ttl, err := raw.TimeToLive(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL != -1 {
		t.Errorf("idle etcd lease still there after Close (TTL %d)", ttl.TTL)
	}
}

// Open reads the prefix from the path and the lock options from the query,
// owns its client, and fails without the password in the error.
func TestOpen(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testutil.Ctx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	l, err := dlock.Open(ctx, "etcd://"+srv.Addr()+",127.0.0.1:1/"+prefix+"?ttl=4s&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.TryAcquire(ctx, "open", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != 4*time.Second {
		t.Errorf("TTL() = %v, want the URL's 4s", ls.TTL())
	}
	if createRevision(t, ctx, raw, "/"+prefix+"open/"+ls.Token()) == 0 {
		t.Error("no key")
	}
	if err := l.Close(ctx); err != nil { // releases, closes its client
		t.Fatal(err)
	}

	// Nothing listens on port 1.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	_, err = dlock.Open(cctx, "etcd://user:s3cr%2Ft@127.0.0.1:1/")
	if err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Open took %v with a 1s ctx", d)
	}
	if strings.Contains(err.Error(), "s3cr") {
		t.Errorf("error shows the password: %v", err)
	}
}

func TestOpenInvalidURL(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"etcd:///prefix",
		"etcd://h:notaport",
		"etcd://h:2379,:2379",
		"etcd://h:70000",
		"etcd://h:2379?tls_ca=/x.pem",
		"etcds://h:2379?tls_cert=/c.pem",
		"etcd://h:2379?dial_timeout=soon",
		"etcd://h:2379?ttl=1s&ttl=2s",
		"etcd://h:2379?bogus=1",
		"etcd://h:2379?ttl=10ms",
		"etcds://h:2379?tls_ca=/nonexistent.pem",
		"etcds://h:2379?tls_insecure_skip_verify=maybe",
	} {
		l, err := dlock.Open(ctx, strings.Replace(u, "://", "://user:s3cret@", 1))
		if !errors.Is(err, dlock.ErrInvalid) {
			if l != nil {
				_ = l.Close(ctx)
			}
			t.Errorf("Open(%s): got %v, want ErrInvalid", u, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%s): the error shows the password: %v", u, err)
		}
	}
	if _, err := dlock.Open(ctx, "etcd://user@h:2379"); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("a user without a password: got %v, want ErrInvalid", err)
	}
}

func TestParseURL(t *testing.T) {
	cfg, opts, err := etcd.ParseURL(mustURL(t, "etcd://u:p%40ss@h1,h2:2380,10.0.0.1:2381/app/locks/?ttl=3s&dial_timeout=1s&dial_keep_alive_time=10s&dial_keep_alive_timeout=4s&auto_sync_interval=1m&lease_per_lock=true"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"http://h1:2379", "http://h2:2380", "http://10.0.0.1:2381"}
	if strings.Join(cfg.Endpoints, " ") != strings.Join(want, " ") {
		t.Errorf("endpoints %v, want %v", cfg.Endpoints, want)
	}
	if cfg.Username != "u" || cfg.Password != "p@ss" {
		t.Errorf("credentials %q/%q", cfg.Username, cfg.Password)
	}
	if cfg.DialTimeout != time.Second || cfg.DialKeepAliveTime != 10*time.Second || cfg.DialKeepAliveTimeout != 4*time.Second || cfg.AutoSyncInterval != time.Minute {
		t.Errorf("timeouts %v %v %v %v", cfg.DialTimeout, cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout, cfg.AutoSyncInterval)
	}
	if cfg.Logger == nil || cfg.TLS != nil {
		t.Errorf("logger %v (want a no-op one), TLS %v (want none)", cfg.Logger, cfg.TLS)
	}
	if opts.KeyPrefix != "/app/locks/" || opts.Defaults.TTL != 3*time.Second || !opts.LeasePerLock {
		t.Errorf("options %+v", opts)
	}
	cfg, opts, err = etcd.ParseURL(mustURL(t, "etcd://[::1]"))
	if err != nil || opts.KeyPrefix != etcd.DefaultKeyPrefix || cfg.Endpoints[0] != "http://[::1]:2379" || opts.LeasePerLock {
		t.Errorf("etcd://[::1]: endpoints %v, prefix %q, %v; want [::1]:2379 and the default prefix", cfg.Endpoints, opts.KeyPrefix, err)
	}
	cfg, _, err = etcd.ParseURL(mustURL(t, "etcds://h?tls_insecure_skip_verify=true&tls_server_name=etcd.test"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS == nil || !cfg.TLS.InsecureSkipVerify || cfg.TLS.ServerName != "etcd.test" || cfg.Endpoints[0] != "https://h:2379" {
		t.Errorf("etcds: TLS %+v, endpoints %v", cfg.TLS, cfg.Endpoints)
	}
}

// A lease survives a restart of the server shorter than its TTL: same key,
// same fence, nobody else granted, the watchdog carries on.
func TestSurvivesRestart(t *testing.T) {
	ctx := testutil.Ctx(t)
	srv := dlocktest.RequireNewWith(t, dlocktest.Etcd, &dlocktest.StartOptions{Env: fastElection})
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	a := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	b := newLocker(t, newClient(t, srv.Addr()), &etcd.Options{KeyPrefix: prefix})
	// The restart must be shorter than the TTL: beside two busy loops a
	// container restart and etcd's recovery took most of 5s, and the
	// contender was granted (after the holder's lease had run out). 10s
	// leaves room; the checks below run for 5s after the restart, through
	// a refresh or two.
	const ttl = 10 * time.Second
	ls, err := a.Acquire(ctx, "restart", &dlock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	fence, _ := ls.Fence()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(ttl / 20) {
		if _, err := b.TryAcquire(ctx, "restart", nil); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("contender after the restart: got %v, want ErrNotAcquired (the holder's lease: valid for %v, ended: %v)", err, time.Until(ls.ValidUntil()), ls.Err())
		}
	}
	select {
	case <-ls.Done():
		t.Fatalf("lease lost across the restart: %v", ls.Err())
	default:
	}
	if ok, err := ls.Held(ctx); !ok || err != nil {
		t.Fatalf("Held after the restart = %v, %v", ok, err)
	}
	if createRevision(t, ctx, raw, prefix+"restart/"+ls.Token()) != int64(fence) {
		t.Fatal("the key was re-created")
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
