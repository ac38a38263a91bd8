package etcd_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcd"
)

// testPKI is a throwaway CA with a server certificate (for 127.0.0.1 and
// etcd.test) and a client certificate, written as PEM files.
type testPKI struct {
	dir                       string
	ca, serverCert, serverKey string
	clientCert, clientKey     string
	caPool                    *x509.CertPool
	server                    tls.Certificate
	otherCA                   string // a CA that signed nothing here
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	caKey, caCert, caDER := selfSigned(t, "dlock test CA")
	_, _, otherDER := selfSigned(t, "unrelated CA")
	p.ca = p.write(t, "ca.pem", "CERTIFICATE", caDER)
	p.otherCA = p.write(t, "other-ca.pem", "CERTIFICATE", otherDER)
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(caCert)

	issue := func(name string, server bool) (certFile, keyFile string, pair tls.Certificate) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		if server {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
			tmpl.DNSNames = []string{"etcd.test"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile = p.write(t, name+".pem", "CERTIFICATE", der)
		keyFile = p.write(t, name+"-key.pem", "EC PRIVATE KEY", keyDER)
		pair, err = tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		return certFile, keyFile, pair
	}
	p.serverCert, p.serverKey, p.server = issue("server", true)
	p.clientCert, p.clientKey, _ = issue("client", false)
	return p
}

func selfSigned(t *testing.T, name string) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert, der
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Open over TLS, through a TLS terminator in front of the test server that
// demands a client certificate: it works with the CA and the client
// certificate, and fails without the certificate, with another CA, or with
// a server name the certificate does not carry.
func TestOpenTLS(t *testing.T) {
	srv, _ := etcdServer(t)
	ctx := testCtx(t)
	raw := newClient(t, srv.Addr())
	prefix := testPrefix(t, raw, 0)
	pki := newPKI(t)
	front := tlsFront(t, srv.Addr(), &tls.Config{
		Certificates: []tls.Certificate{pki.server},
		ClientCAs:    pki.caPool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	base := "etcds://" + front + "/" + prefix + "?dial_timeout=2s"
	cert := "&tls_cert=" + pki.clientCert + "&tls_key=" + pki.clientKey

	l, err := dlock.Open(ctx, base+"&tls_ca="+pki.ca+cert)
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
		base + "&tls_ca=" + pki.ca + "&tls_server_name=etcd.test" + cert,
	} {
		l, err = dlock.Open(ctx, good)
		if err != nil {
			t.Fatalf("Open(%s): %v", good, err)
		}
		_ = l.Close(ctx)
	}

	for _, bad := range []string{
		base + "&tls_ca=" + pki.ca,                                        // no client certificate
		base + "&tls_ca=" + pki.otherCA + cert,                            // server not trusted
		base + "&tls_ca=" + pki.ca + "&tls_server_name=other.test" + cert, // wrong name
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
	pki := newPKI(t)
	cfg, _, err := etcd.ParseURL("etcds://10.0.0.9:2379?tls_server_name=etcd.test&tls_ca=" + pki.ca + "&tls_cert=" + pki.clientCert + "&tls_key=" + pki.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	tc := cfg.TLS
	switch {
	case tc == nil:
		t.Fatal("no TLS config for etcds")
	case tc.RootCAs == nil || !tc.RootCAs.Equal(pki.caPool):
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

// tlsFront listens on 127.0.0.1 with cfg (plus ALPN h2, which gRPC
// requires) and forwards every connection to target in plain TCP; it stops
// at cleanup.
func tlsFront(t *testing.T, target string, cfg *tls.Config) string {
	t.Helper()
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if err := c.(*tls.Conn).HandshakeContext(context.Background()); err != nil {
					return
				}
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				track(s)
				defer s.Close()
				done := make(chan struct{})
				go func() {
					_, _ = io.Copy(s, c)
					_ = s.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				_, _ = io.Copy(c, s)
				_ = c.Close()
				<-done
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
