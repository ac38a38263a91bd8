package redis_test

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
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redis"
)

// testPKI is a throwaway CA with a server certificate (for 127.0.0.1 and
// redis.test) and a client certificate, written as PEM files.
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
			tmpl.DNSNames = []string{"redis.test"}
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

// rediss URL parameters become the tls.Config: trusted CAs, the client
// certificate, the server name, skip-verify; plain redis URLs get none, and
// URL-made clients honour context deadlines.
func TestTLSParams(t *testing.T) {
	pki := newPKI(t)
	q := url.Values{
		"tls_ca":          {pki.ca},
		"tls_cert":        {pki.clientCert},
		"tls_key":         {pki.clientKey},
		"tls_server_name": {"redis.test"},
	}
	gopts, opts, err := redis.ParseURL("rediss://u:pw@10.0.0.9:6380/3?ttl=4s&prefix=x:&pool_size=7&" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	cfg := gopts.TLSConfig
	switch {
	case cfg == nil:
		t.Fatal("no TLS config for rediss")
	case cfg.RootCAs == nil || !cfg.RootCAs.Equal(pki.caPool):
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
	if opts.Lock.TTL != 4*time.Second || opts.KeyPrefix != "x:" || opts.Compat {
		t.Errorf("driver options %+v; want ttl 4s, prefix x:", opts)
	}

	gopts, _, err = redis.ParseURL("rediss://10.0.0.9?tls_insecure_skip_verify=true")
	if err != nil {
		t.Fatal(err)
	}
	if !gopts.TLSConfig.InsecureSkipVerify || gopts.TLSConfig.ServerName != "10.0.0.9" || gopts.TLSConfig.RootCAs != nil {
		t.Errorf("skip-verify config %+v; want InsecureSkipVerify, ServerName from the host, system roots", gopts.TLSConfig)
	}
	gopts, _, err = redis.ParseURL("redis://10.0.0.9")
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
	pki := newPKI(t)
	front := tlsFront(t, addr, &tls.Config{
		Certificates: []tls.Certificate{pki.server},
		ClientCAs:    pki.caPool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	base := "rediss://" + front + "?prefix=" + url.QueryEscape(p) + "&dial_timeout=2s"
	cert := "&tls_cert=" + pki.clientCert + "&tls_key=" + pki.clientKey

	l, err := dlock.Open(ctx, base+"&tls_ca="+pki.ca+cert)
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
		base + "&tls_ca=" + pki.ca,                                        // no client certificate
		base + "&tls_ca=" + pki.otherCA + cert,                            // server not trusted
		base + "&tls_ca=" + pki.ca + "&tls_server_name=other.test" + cert, // wrong name
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

// tlsFront listens on 127.0.0.1 with cfg and forwards every connection to
// target in plain TCP; it stops at cleanup.
func tlsFront(t *testing.T, target string, cfg *tls.Config) string {
	t.Helper()
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
