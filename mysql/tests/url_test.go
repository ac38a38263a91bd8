package tests_test

import (
	"context"
	"database/sql"
	"errors"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/mysql"
	gomysql "github.com/go-sql-driver/mysql"
)

func mustURL(t testing.TB, s string) *neturl.URL {
	t.Helper()
	u, err := neturl.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// ParseURL maps the URL's parts and parameters onto the client's config and
// the driver's options.
func TestParseURL(t *testing.T) {
	cfg, opts, err := mysql.ParseURL(mustURL(t, "mysql://app:s3cret@db.internal/appdb?ttl=10s&prefix=billing/&fencing=false&connect_timeout=3s&tls=true"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "db.internal:3306" || cfg.User != "app" || cfg.Passwd != "s3cret" || cfg.DBName != "appdb" || cfg.Timeout != 3*time.Second {
		t.Errorf("config = %s@%s/%s timeout %v, want app@db.internal:3306/appdb timeout 3s", cfg.User, cfg.Addr, cfg.DBName, cfg.Timeout)
	}
	if cfg.TLS == nil || cfg.TLS.ServerName != "db.internal" || cfg.TLS.InsecureSkipVerify {
		t.Errorf("TLS = %+v, want verified for db.internal", cfg.TLS)
	}
	if opts.Defaults.TTL != 10*time.Second || opts.KeyPrefix != "billing/" || !opts.NoFencing {
		t.Errorf("options = %+v, want ttl 10s, prefix billing/, no fencing", opts)
	}
	cfg, opts, err = mysql.ParseURL(mustURL(t, "mysql://h:3307?fence_table=locks.fence"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "h:3307" || cfg.TLS != nil || opts.FenceTable != "locks.fence" {
		t.Errorf("got %s TLS %v fence table %q, want h:3307, no TLS, locks.fence", cfg.Addr, cfg.TLS, opts.FenceTable)
	}
}

// Bad URLs fail with ErrInvalid before any I/O (the hosts do not exist),
// and no error shows the password.
func TestBadURLs(t *testing.T) {
	const secret = "s3cretpw"
	for _, u := range []string{
		"mysql://u:" + secret + "@h/db?bogus=1",
		"mysql://u:" + secret + "@h/db?ttl=100ms",
		"mysql://u:" + secret + "@h/db?ttl=abc",
		"mysql://u:" + secret + "@h/db?fencing=maybe",
		"mysql://u:" + secret + "@h/db?fence_table=a;b",
		"mysql://u:" + secret + "@h/db?fence_table=a.b.c",
		"mysql://u:" + secret + "@h/db?max_open_conns=-1",
		"mysql://u:" + secret + "@h/db?tls_cert=/c.pem",
		"mysql://u:" + secret + "@h/db?tls_ca=/nonexistent.pem",
		"mysql://u:" + secret + "@h/db/more",
		"mysql://u:" + secret + "@h1,h2/db",
		"mysql://u:" + secret + "@h:99999/db",
		"mysql://u:" + secret + "@/db",
		"mysql://u:" + secret + "@h/db?prefix=a&prefix=b",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err := dlock.Open(ctx, u)
		cancel()
		if err == nil {
			l.Close(context.Background())
			t.Errorf("Open(%s): no error", u)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%s) = %v, want ErrInvalid", u, err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%s): the error shows the password: %v", u, err)
		}
	}
	if _, err := mysql.New(nil, nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("New(nil) = %v, want ErrInvalid", err)
	}
	if _, err := mysql.New(&sql.DB{}, &mysql.Options{Defaults: dlock.Options{TTL: 500 * time.Millisecond}}); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("New with a TTL under MinTTL = %v, want ErrInvalid", err)
	}
}

// LockName keeps names the server takes, and hashes longer ones to 64
// characters.
func TestLockName(t *testing.T) {
	if got := mysql.LockName("app/", "jobs"); got != "app/jobs" {
		t.Errorf("LockName = %q, want app/jobs", got)
	}
	long := strings.Repeat("é", 65)
	got := mysql.LockName("", long)
	if len(got) != mysql.MaxNameLen || !strings.HasPrefix(got, "dlock:") || got == mysql.LockName("", long+"x") {
		t.Errorf("LockName of a long name = %q, want dlock: and 58 hex digits, distinct per name", got)
	}
}

// The server: a wrong password fails Open without showing it; TLS is
// negotiated with tls_* parameters, and tls=true verifies the server's
// certificate (self-signed here, so it fails).
func TestOpenServer(t *testing.T) {
	srv := dlocktest.Require(t, dlocktest.MariaDB)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	const wrong = "wr0ngpassword"
	_, err := dlock.Open(ctx, "mysql://"+dlocktest.MariaDBUser+":"+wrong+"@"+srv.Addr()+"/"+dlocktest.MariaDBDatabase)
	if err == nil || strings.Contains(err.Error(), wrong) {
		t.Errorf("Open with a wrong password = %v, want an error without the password", err)
	}

	_, err = dlock.Open(ctx, url(srv.Addr(), "tls=true"))
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Open with tls=true on a self-signed server = %v, want a certificate error", err)
	}

	l, err := dlock.Open(ctx, url(srv.Addr(), "tls_insecure_skip_verify=true"))
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.Acquire(ctx, "tls-"+t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := ls.Fence(); !ok || f == 0 {
		t.Errorf("Fence() = %d, %v; want a token", f, ok)
	}
	if err := ls.Release(ctx); err != nil {
		t.Error(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Error(err)
	}

	cfg, _, err := mysql.ParseURL(mustURL(t, url(srv.Addr(), "tls_insecure_skip_verify=true")))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	var name, cipher string
	if err := db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil || cipher == "" {
		t.Errorf("Ssl_cipher = %q, %v; want a TLS session", cipher, err)
	}
}
