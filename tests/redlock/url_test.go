package redlock_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/redlock"
)

const secret = "s3cr3t-Pw0rd"

// A URL sets every node's client options alike and the driver's options.
func TestParseURL(t *testing.T) {
	nodes, opts, err := parseRawURL("redlock://user:" + secret + "@h1:7001,h2:7002,h3:7003/2" +
		"?ttl=3s&node_timeout=50ms&drift=5ms&prefix=app:&compat=true&dial_timeout=2s&pool_size=7")
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(nodes))
	}
	for i, o := range nodes {
		if want := fmt.Sprintf("h%d:700%d", i+1, i+1); o.Addr != want {
			t.Errorf("node %d: Addr %q, want %q", i, o.Addr, want)
		}
		if o.Username != "user" || o.Password != secret || o.DB != 2 || o.DialTimeout != 2*time.Second || o.PoolSize != 7 {
			t.Errorf("node %d: user %q, password set %v, db %d, dial timeout %v, pool size %d; want user, the password, 2, 2s, 7",
				i, o.Username, o.Password == secret, o.DB, o.DialTimeout, o.PoolSize)
		}
		if !o.ContextTimeoutEnabled || o.DialerRetries != 1 || o.TLSConfig != nil {
			t.Errorf("node %d: ContextTimeoutEnabled %v, DialerRetries %d, TLS %v; want true, 1, none", i, o.ContextTimeoutEnabled, o.DialerRetries, o.TLSConfig != nil)
		}
	}
	want := redlock.Options{Defaults: dlock.Options{TTL: 3 * time.Second}, KeyPrefix: "app:", Compat: true, NodeTimeout: 50 * time.Millisecond, Drift: 5 * time.Millisecond}
	if *opts != want {
		t.Errorf("options %+v, want %+v", *opts, want)
	}

	nodes, _, err = parseRawURL("redlock://a,b,c")
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range nodes {
		if want := string(rune('a'+i)) + ":6379"; o.Addr != want {
			t.Errorf("node %d: Addr %q, want %q (the default port)", i, o.Addr, want)
		}
	}
}

// redlocks URLs verify every node with the same CA and client certificate;
// the server name is each node's host unless tls_server_name says otherwise.
func TestParseURLTLS(t *testing.T) {
	ca, cert, key := writePKI(t)
	nodes, _, err := parseRawURL(fmt.Sprintf("redlocks://h1:1,h2:2,h3:3?tls_ca=%s&tls_cert=%s&tls_key=%s", ca, cert, key))
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range nodes {
		c := o.TLSConfig
		switch {
		case c == nil:
			t.Fatalf("node %d: no TLS", i)
		case c.ServerName != fmt.Sprintf("h%d", i+1):
			t.Errorf("node %d: ServerName %q, want its host", i, c.ServerName)
		case c.RootCAs == nil || len(c.Certificates) != 1 || c.InsecureSkipVerify || c.MinVersion < tls.VersionTLS12:
			t.Errorf("node %d: CA set %v, %d client certificates, skip verify %v, min version %x", i, c.RootCAs != nil, len(c.Certificates), c.InsecureSkipVerify, c.MinVersion)
		}
	}
	if nodes[0].TLSConfig == nodes[1].TLSConfig {
		t.Error("nodes share one tls.Config")
	}
	nodes, _, err = parseRawURL("redlocks://h1:1,h2:2,h3:3?tls_server_name=redis.test&tls_insecure_skip_verify=true")
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range nodes {
		if o.TLSConfig.ServerName != "redis.test" || !o.TLSConfig.InsecureSkipVerify {
			t.Errorf("node %d: ServerName %q, skip verify %v; want redis.test, true", i, o.TLSConfig.ServerName, o.TLSConfig.InsecureSkipVerify)
		}
	}
}

// writePKI writes a self-signed CA and a client certificate and key it
// signed, as PEM files.
func writePKI(t *testing.T) (ca, cert, key string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "client"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &clientKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		t.Fatal(err)
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("client.pem", "CERTIFICATE", der), write("client-key.pem", "EC PRIVATE KEY", keyDER)
}

// Bad URLs fail with ErrInvalid before any I/O (the hosts are closed
// ports), and no error repeats the password.
func TestOpenInvalidURL(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth := "redlock://user:" + secret + "@"
	hosts := "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
	base := auth + hosts
	tlsBase := "redlocks://user:" + secret + "@" + hosts
	for _, u := range []string{
		auth + "127.0.0.1:1,127.0.0.1:2",
		auth + "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4",
		auth + "127.0.0.1:1,127.0.0.1:2,127.0.0.1:1",
		auth + "127.0.0.1:1,,127.0.0.1:3",
		auth + "127.0.0.1:1,127.0.0.1:2,127.0.0.1",
		auth + "[::1]:1,127.0.0.1:2,127.0.0.1:3",
		"redlock:opaque",
		base + "?ttl=soon",
		base + "?ttl=1ms",
		base + "?ttl=1s&refresh_interval=2s",
		base + "?node_timeout=0s",
		base + "?node_timeout=fast",
		base + "?drift=-1ms",
		base + "?compat=maybe",
		base + "?prefix=a&prefix=b",
		base + "?nonsense=1",
		base + "?pool_size=many",
		base + "/notadb",
		base + "?tls_ca=/etc/ssl/certs/ca-certificates.crt",
		base + "?%zz",
		tlsBase + "?tls_cert=" + garbage,
		tlsBase + "?tls_ca=" + filepath.Join(dir, "missing.pem"),
		tlsBase + "?tls_ca=" + garbage,
		tlsBase + "?tls_cert=" + garbage + "&tls_key=" + garbage,
		tlsBase + "?tls_insecure_skip_verify=perhaps",
	} {
		l, err := dlock.Open(ctx, u)
		if err == nil {
			_ = l.Close(ctx)
			t.Errorf("Open(%s) succeeded", u)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%s): %v; want ErrInvalid", u, err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%s): error %q contains the password", u, err)
		}
	}
}

// Open works with a URL's options and an ACL user on every node; it starts
// with a minority of nodes unreachable, and fails, without the password,
// when a majority is, or when the password is wrong.
func TestOpen(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, 3, nil)
	user, pass := "dlocktest-"+randomHex(4), secret+randomHex(4)
	for _, r := range c.raws {
		if err := r.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pass, "~app:*", "&app:*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
	}
	a := c.addrs()
	open := func(pw string, addrs ...string) (*dlock.Locker, error) {
		return dlock.Open(ctx, fmt.Sprintf("redlock://%s:%s@%s?prefix=app:&ttl=3s&node_timeout=200ms", user, pw, strings.Join(addrs, ",")))
	}

	l, err := open(pass, a...)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.TryAcquire(ctx, "open", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != 3*time.Second {
		t.Errorf("TTL %v; want 3s from the URL", ls.TTL())
	}
	// A majority decides: the last node may take the lock a moment after
	// TryAcquire returned.
	eventually(t, time.Second, "the lock on every node with about 3s left", func() bool {
		for _, r := range c.raws {
			if ttl, err := r.PTTL(ctx, "app:{open}").Result(); err != nil || ttl <= 2*time.Second || ttl > 3*time.Second {
				return false
			}
		}
		return true
	})
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// One node of three is a closed port: a majority answers.
	l, err = open(pass, a[0], a[1], "127.0.0.1:1")
	if err != nil {
		t.Fatalf("Open with one node of three down: %v", err)
	}
	ls, err = l.TryAcquire(ctx, "open", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		what  string
		pw    string
		addrs []string
	}{
		{"two nodes of three down", pass, []string{a[0], "127.0.0.1:1", "127.0.0.1:2"}},
		{"a wrong password", secret + "-wrong", a},
	} {
		l, err := open(tc.pw, tc.addrs...)
		if err == nil {
			_ = l.Close(ctx)
			t.Errorf("Open with %s succeeded", tc.what)
			continue
		}
		if errors.Is(err, dlock.ErrInvalid) || strings.Contains(err.Error(), secret) {
			t.Errorf("Open with %s: %v; want a connection error without the password", tc.what, err)
		}
	}
}

func TestSchemesRegistered(t *testing.T) {
	for _, s := range []string{"redlock", "redlocks"} {
		if !slices.Contains(dlockdriver.Schemes(), s) {
			t.Errorf("scheme %q not registered", s)
		}
	}
}
