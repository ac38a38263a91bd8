package etcd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcd"
	"github.com/dlock/dlock/internal/testpki"
)

// Open over TLS, through a TLS terminator in front of the test server that
// demands a client certificate: it works with the CA and the client
// certificate, and fails without the certificate, with another CA, or with
// a server name the certificate does not carry.
func TestOpenTLS(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	pki := testpki.New(t, "etcd.test")
	front := testpki.Front(t, srv.Addr(), &tls.Config{
		Certificates: []tls.Certificate{pki.Server},
		ClientCAs:    pki.CAPool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2"}, // gRPC insists on ALPN h2
	})
	base := "etcds://" + front + "/" + prefix + "?dial_timeout=2s"
	cert := "&tls_cert=" + pki.ClientCert + "&tls_key=" + pki.ClientKey

	l, err := dlock.Open(ctx, base+"&tls_ca="+pki.CA+cert)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.TryAcquire(ctx, "tls", nil)
	if err != nil {
		t.Fatal(err)
	}
	if createRevision(t, ctx, raw, "/"+prefix+"tls/"+ls.Token()) == 0 {
		t.Error("the lock taken over TLS is not on the server")
	}
	if err := l.Close(ctx); err != nil { // releases
		t.Fatal(err)
	}

	for _, good := range []string{
		base + "&tls_insecure_skip_verify=true" + cert,
		base + "&tls_ca=" + pki.CA + "&tls_server_name=etcd.test" + cert,
	} {
		l, err = dlock.Open(ctx, good)
		if err != nil {
			t.Fatalf("Open(%s): %v", good, err)
		}
		_ = l.Close(ctx)
	}

	for _, bad := range []string{
		base + "&tls_ca=" + pki.CA,                                        // no client certificate
		base + "&tls_ca=" + pki.OtherCA + cert,                            // server not trusted
		base + "&tls_ca=" + pki.CA + "&tls_server_name=other.test" + cert, // wrong name
	} {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
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

// etcds URL parameters become the tls.Config: trusted CAs, the client
// certificate, the server name.
func TestTLSParams(t *testing.T) {
	pki := testpki.New(t, "etcd.test")
	cfg, _, err := etcd.ParseURL(mustURL(t, "etcds://10.0.0.9:2379?tls_server_name=etcd.test&tls_ca="+pki.CA+"&tls_cert="+pki.ClientCert+"&tls_key="+pki.ClientKey))
	if err != nil {
		t.Fatal(err)
	}
	tc := cfg.TLS
	switch {
	case tc == nil:
		t.Fatal("no TLS config for etcds")
	case tc.RootCAs == nil || !tc.RootCAs.Equal(pki.CAPool):
		t.Error("RootCAs is not the tls_ca file's CA")
	case len(tc.Certificates) != 1:
		t.Errorf("%d client certificates, want 1", len(tc.Certificates))
	case tc.ServerName != "etcd.test":
		t.Errorf("ServerName %q, want etcd.test", tc.ServerName)
	case tc.InsecureSkipVerify:
		t.Error("InsecureSkipVerify set without tls_insecure_skip_verify")
	case tc.MinVersion < tls.VersionTLS12:
		t.Errorf("MinVersion %x, want at least TLS 1.2", tc.MinVersion)
	}
}
