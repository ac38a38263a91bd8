package zookeeper_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/zookeeper"
	"github.com/go-zookeeper/zk"
)

// open opens a URL, closed at cleanup.
func open(t *testing.T, rawURL string) *dlock.Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, rawURL)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

// TestOpenInvalid: bad URLs are rejected with ErrInvalid before any I/O,
// without the password in the error.
func TestOpenInvalid(t *testing.T) {
	const secret = "pa55word"
	for _, u := range []string{
		"zk://",
		"zk:opaque",
		"zk://u:" + secret + "@127.0.0.1:99999/",
		"zk://u:" + secret + "@127.0.0.1:2181,:2181/",
		"zk://u:" + secret + "@127.0.0.1:2181/zookeeper",
		"zk://u:" + secret + "@127.0.0.1:2181/a//b",
		"zk://u:" + secret + "@127.0.0.1:2181/a/./b",
		"zk://user-only@127.0.0.1:2181/",
		"zk://u:" + secret + "@127.0.0.1:2181/?acl=world:anyone",
		"zk://u:" + secret + "@127.0.0.1:2181/?acl=world:anyone:rwx",
		"zk://u:" + secret + "@127.0.0.1:2181/?acl=open&acl=read",
		"zk://u:" + secret + "@127.0.0.1:2181/?ttl=soon",
		"zk://u:" + secret + "@127.0.0.1:2181/?password=" + secret,
		"zk://u:" + secret + "@127.0.0.1:2181/?%zz",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		l, err := dlock.Open(ctx, u)
		cancel()
		if err == nil {
			_ = l.Close(context.Background())
			t.Errorf("Open(%s): no error", u)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%s): got %v, want ErrInvalid", u, err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%s): the error shows the password: %v", u, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("Open(%s) took %v: I/O before rejecting", u, d)
		}
	}
}

// TestOpenUnreachable: ctx bounds Open against a server that accepts
// connections and never answers; the error names the servers but not the
// password. (One that refuses connections fails at once:
// TestOpenRefusedFailsFast.)
func TestOpenUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // the kernel accepts; nobody answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = dlock.Open(ctx, "zk://u:topsecret@"+ln.Addr().String()+"/")
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Open of an unreachable server: got %v, want a deadline error", err)
	}
	if strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("the error shows the password: %v", err)
	}
}

// TestOpenRootAndTTL: the URL's path is the root, ttl the default TTL, and
// the server's minimum session timeout is the Locker's MinTTL.
func TestOpenRootAndTTL(t *testing.T) {
	srv := zkServer(t)
	root := "/dlock-url-" + randomHex(3) + "/nested"
	l := open(t, "zk://"+srv.Addr()+root+"?ttl=2s&metadata=host-a")
	if got := l.Capabilities().MinTTL; got != 100*time.Millisecond {
		t.Errorf("MinTTL = %v, want the server's 100ms", got)
	}
	ls, err := l.TryAcquire(context.Background(), "n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != 2*time.Second {
		t.Errorf("TTL() = %v, want 2s", ls.TTL())
	}
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	children, _, err := raw.Children(root + "/n")
	if err != nil || len(children) != 1 {
		t.Fatalf("children of %s/n: %v, %v", root, children, err)
	}
	data, _, err := raw.Get(root + "/n/" + children[0])
	if err != nil || string(data) != "host-a" {
		t.Errorf("lock node data = %q, %v; want the metadata", data, err)
	}
	if !strings.Contains(children[0], ls.Token()) {
		t.Errorf("lock node %s does not carry the lease token %s", children[0], ls.Token())
	}
	release(t, ls)
}

// TestDigestCredentials: with a user and password in the URL the nodes are
// creator-only; other credentials cannot lock the same name, and no error
// shows either password.
func TestDigestCredentials(t *testing.T) {
	srv := zkServer(t)
	root := "/dlock-auth-" + randomHex(3)
	alice := open(t, "zk://alice:wonder1and@"+srv.Addr()+root+"?ttl=2s")
	bob := open(t, "zk://bob:bu1lder@"+srv.Addr()+root+"?ttl=2s")
	ctx := context.Background()
	ls, err := alice.TryAcquire(ctx, "shared", nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	if err := raw.AddAuth("digest", []byte("alice:wonder1and")); err != nil { // reading an ACL needs READ
		t.Fatal(err)
	}
	acl, _, err := raw.GetACL(root + "/shared")
	if err != nil {
		t.Fatal(err)
	}
	want := zk.DigestACL(zk.PermAll, "alice", "wonder1and")
	if len(acl) != 1 || acl[0] != want[0] {
		t.Errorf("ACL of the name's node = %v, want %v", acl, want)
	}
	_, err = bob.TryAcquire(ctx, "shared", nil)
	if err == nil || !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("TryAcquire with other credentials: got %v, want zk.ErrNoAuth", err)
	}
	if err != nil && (strings.Contains(err.Error(), "bu1lder") || strings.Contains(err.Error(), "wonder1and")) {
		t.Errorf("the error shows a password: %v", err)
	}
	release(t, ls)

	// The root is alice's too: bob cannot lock any name under it.
	if _, err := bob.TryAcquire(ctx, "other", nil); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("TryAcquire under alice's root: got %v, want zk.ErrNoAuth", err)
	}

	// acl=open, on a root of its own, lets anyone in.
	root += "-open"
	bob = open(t, "zk://bob:bu1lder@"+srv.Addr()+root+"?ttl=2s")
	carol := open(t, "zk://carol:c4rol@"+srv.Addr()+root+"?ttl=2s&acl=open")
	lc, err := carol.TryAcquire(ctx, "open", nil)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := bob.TryAcquire(ctx, "open", nil)
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("bob on carol's open name while held: got %v, %v; want ErrNotAcquired", lb, err)
	}
	release(t, lc)
	lb, err = bob.TryAcquire(ctx, "open", nil)
	if err != nil {
		t.Fatalf("bob on an open name: %v", err)
	}
	release(t, lb)
}

// TestParseACL checks the acl parameter's forms against the nodes made.
func TestParseACL(t *testing.T) {
	srv := zkServer(t)
	root := "/dlock-acl-" + randomHex(3)
	raw := rawConn(t, srv.Addr(), 10*time.Second)
	for _, tc := range []struct {
		param string
		want  []zk.ACL
	}{
		{"read", append(zk.AuthACL(zk.PermAll), zk.WorldACL(zk.PermRead)...)},
		{"world:anyone:cdrwa", zk.WorldACL(zk.PermAll)},
		{"ip:127.0.0.1:r,world:anyone:cdrw", []zk.ACL{{Perms: zk.PermRead, Scheme: "ip", ID: "127.0.0.1"}, {Perms: zk.PermAll &^ zk.PermAdmin, Scheme: "world", ID: "anyone"}}},
	} {
		l := open(t, "zk://"+srv.Addr()+root+"?acl="+tc.param)
		name := "acl-" + randomHex(3)
		ls, err := l.TryAcquire(context.Background(), name, nil)
		if err != nil {
			if tc.param == "read" && errors.Is(err, zk.ErrInvalidACL) {
				continue // "auth" without credentials: the server refuses it
			}
			t.Fatalf("acl=%s: %v", tc.param, err)
		}
		got, _, err := raw.GetACL(root + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(tc.want) {
			t.Fatalf("acl=%s: got %v, want %v", tc.param, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("acl=%s: got %v, want %v", tc.param, got, tc.want)
			}
		}
		release(t, ls)
	}
	_ = zookeeper.DefaultRoot
}
