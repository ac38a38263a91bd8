package redis_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/testpki"
)

// rediss URL parameters become the tls.Config: trusted CAs, the client
// certificate, the server name, skip-verify; plain redis URLs get none, and
// URL-made clients honour context deadlines.
func TestTLSParams(t *testing.T) {
	pki := testpki.New(t, "redis.test")
	q := url.Values{
		"tls_ca":          {pki.CA},
		"tls_cert":        {pki.ClientCert},
		"tls_key":         {pki.ClientKey},
		"tls_server_name": {"redis.test"},
	}
	gopts, opts, err := parseRawURL("rediss://u:pw@10.0.0.9:6380/3?ttl=4s&prefix=x:&pool_size=7&" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	cfg := gopts.TLSConfig
	switch {
	case cfg == nil:
		t.Fatal("no TLS config for rediss")
	case cfg.RootCAs == nil || !cfg.RootCAs.Equal(pki.CAPool):
		t.Error("RootCAs is not the tls_ca file's CA")
	case len(cfg.Certificates) != 1:
		t.Errorf("%d client certificates, want 1", len(cfg.Certificates))
	case cfg.ServerName != "redis.test":
		t.Errorf("ServerName %q, want redis.test", cfg.ServerName)
	case cfg.InsecureSkipVerify:
		t.Error("InsecureSkipVerify set without tls_insecure_skip_verify")
	case cfg.MinVersion < tls.VersionTLS12:
		t.Errorf("MinVersion %x, want at least TLS 1.2", cfg.MinVersion)
	}
	if gopts.Addr != "10.0.0.9:6380" || gopts.DB != 3 || gopts.PoolSize != 7 || gopts.Username != "u" || gopts.Password != "pw" {
		t.Errorf("go-redis options %+v; want addr, db, pool size and credentials from the URL", gopts)
	}
	if !gopts.ContextTimeoutEnabled {
		t.Error("ContextTimeoutEnabled is off")
	}
	if opts.Defaults.TTL != 4*time.Second || opts.KeyPrefix != "x:" || opts.Compat {
		t.Errorf("driver options %+v; want ttl 4s, prefix x:", opts)
	}

	gopts, _, err = parseRawURL("rediss://10.0.0.9?tls_insecure_skip_verify=true")
	if err != nil {
		t.Fatal(err)
	}
	if !gopts.TLSConfig.InsecureSkipVerify || gopts.TLSConfig.ServerName != "10.0.0.9" || gopts.TLSConfig.RootCAs != nil {
		t.Errorf("skip-verify config %+v; want InsecureSkipVerify, ServerName from the host, system roots", gopts.TLSConfig)
	}
	gopts, _, err = parseRawURL("redis://10.0.0.9")
	if err != nil {
		t.Fatal(err)
	}
	if gopts.TLSConfig != nil || gopts.Addr != "10.0.0.9:6379" {
		t.Errorf("redis:// gave TLS config %v, addr %s", gopts.TLSConfig, gopts.Addr)
	}
}

// Open over TLS, through a TLS terminator in front of the test server that
// demands a client certificate: it works with the CA and the client
// certificate, and fails without the certificate, with another CA, or with
// a server name the certificate does not carry.
func TestOpenTLS(t *testing.T) {
	ctx := testCtx(t)
	addr := redisAddr(t)
	raw := newClient(t, addr)
	p := testPrefix(t, raw)
	pki := testpki.New(t, "redis.test")
	front := testpki.Front(t, addr, &tls.Config{
		Certificates: []tls.Certificate{pki.Server},
		ClientCAs:    pki.CAPool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	base := "rediss://" + front + "?prefix=" + url.QueryEscape(p) + "&dial_timeout=2s"
	cert := "&tls_cert=" + pki.ClientCert + "&tls_key=" + pki.ClientKey

	l, err := dlock.Open(ctx, base+"&tls_ca="+pki.CA+cert)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.TryAcquire(ctx, "tls", nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := raw.Get(ctx, p+"{tls}").Result(); v != ls.Token() {
		t.Errorf("the lock taken over TLS is not on the server: %q", v)
	}
	if err := l.Close(ctx); err != nil { // releases
		t.Fatal(err)
	}

	l, err = dlock.Open(ctx, base+"&tls_insecure_skip_verify=true"+cert)
	if err != nil {
		t.Fatalf("Open with tls_insecure_skip_verify: %v", err)
	}
	_ = l.Close(ctx)

	for _, bad := range []string{
		base + "&tls_ca=" + pki.CA,                                        // no client certificate
		base + "&tls_ca=" + pki.OtherCA + cert,                            // server not trusted
		base + "&tls_ca=" + pki.CA + "&tls_server_name=other.test" + cert, // wrong name
	} {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := dlock.Open(cctx, bad)
		cancel()
		if err == nil {
			_ = l.Close(ctx)
			t.Errorf("Open(%s) succeeded", bad)
		} else if errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%s): %v; want a connection error, not ErrInvalid", bad, err)
		}
	}
}
