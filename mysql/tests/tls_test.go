package tests_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/pem"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	testpki "github.com/dlock/dlock/dlocktest/pki"
	"github.com/dlock/dlock/mysql"
	gomysql "github.com/go-sql-driver/mysql"
)

// serverCA writes the test server's self-signed certificate (for 127.0.0.1
// and localhost, made when its image was built) to a PEM file, as the CA
// of tls_ca: read from a handshake that does not verify it.
func serverCA(t *testing.T, addr string) string {
	t.Helper()
	var cert *x509.Certificate
	cfg := gomysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", addr, dlocktest.MariaDBDatabase
	cfg.User, cfg.Passwd = dlocktest.MariaDBUser, dlocktest.MariaDBPassword
	cfg.Logger = &gomysql.NopLogger{}
	cfg.TLS = &tls.Config{
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			cert = cs.PeerCertificates[0]
			return nil
		},
	}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil || cert == nil {
		t.Fatalf("reading the server's certificate: %v", err)
	}
	path := filepath.Join(t.TempDir(), "server-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// With tls_ca naming the server's CA, Open verifies the server's
// certificate and its name (the URL's host, or tls_server_name) and the
// lock works over TLS; another CA or a name the certificate does not carry
// fails Open with a certificate error.
func TestTLSWithCA(t *testing.T) {
	addr := dlocktest.Require(t, dlocktest.MariaDB).Addr()
	ca := serverCA(t, addr)
	other := testpki.New(t, "other.test").CA
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	q := func(kv ...string) string {
		v := neturl.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v.Encode()
	}

	for _, query := range []string{q("tls_ca", ca), q("tls_ca", ca, "tls_server_name", "localhost")} {
		l, err := dlock.Open(ctx, url(addr, query))
		if err != nil {
			t.Fatalf("Open(…?%s): %v", query, err)
		}
		ls, err := l.Acquire(ctx, "tls-ca-"+t.Name(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			t.Error(err)
		}
		if err := l.Close(ctx); err != nil {
			t.Error(err)
		}
	}

	for _, query := range []string{q("tls_ca", other), q("tls_ca", ca, "tls_server_name", "other.test")} {
		l, err := dlock.Open(ctx, url(addr, query))
		if err == nil {
			l.Close(ctx)
			t.Errorf("Open(…?%s): no error, want a certificate error", query)
			continue
		}
		if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("Open(…?%s) = %v, want a certificate error", query, err)
		}
	}

	// The config ParseURL makes trusts the CA alone, not the system's.
	cfg, _, err := mysql.ParseURL(mustURL(t, url(addr, q("tls_ca", ca))))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS == nil || cfg.TLS.RootCAs == nil || cfg.TLS.InsecureSkipVerify || cfg.TLS.ServerName != "127.0.0.1" {
		t.Errorf("TLS config %+v, want the CA's pool, verified, for 127.0.0.1", cfg.TLS)
	}
}
