// Package pki gives tests a throwaway certificate authority with server
// and client certificates, and a TLS terminator to put in front of a test
// server that speaks plain TCP.
package pki

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// PKI is a throwaway CA with a server certificate (for 127.0.0.1 and a DNS
// name) and a client certificate, written as PEM files in a test's temporary
// directory, plus a second CA that signed nothing.
type PKI struct {
	dir                       string
	CA, ServerCert, ServerKey string // PEM file paths
	ClientCert, ClientKey     string // PEM file paths
	CAPool                    *x509.CertPool
	Server                    tls.Certificate
	OtherCA                   string // PEM file of a CA that signed nothing here
}

// New makes a PKI whose server certificate is for 127.0.0.1 and dnsName.
func New(t testing.TB, dnsName string) *PKI {
	t.Helper()
	p := &PKI{dir: t.TempDir()}
	caKey, caCert, caDER := selfSigned(t, "dlock test CA")
	_, _, otherDER := selfSigned(t, "unrelated CA")
	p.CA = p.write(t, "ca.pem", "CERTIFICATE", caDER)
	p.OtherCA = p.write(t, "other-ca.pem", "CERTIFICATE", otherDER)
	p.CAPool = x509.NewCertPool()
	p.CAPool.AddCert(caCert)

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
			tmpl.DNSNames = []string{dnsName}
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
	p.ServerCert, p.ServerKey, p.Server = issue("server", true)
	p.ClientCert, p.ClientKey, _ = issue("client", false)
	return p
}

func selfSigned(t testing.TB, name string) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
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

func (p *PKI) write(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Front is a TLS terminator: it listens on 127.0.0.1 with cfg and forwards
// every connection to target in plain TCP, and stops at cleanup. It returns
// its address.
func Front(t testing.TB, target string, cfg *tls.Config) string {
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
