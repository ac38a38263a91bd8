package driver_test

import (
	"crypto/tls"
	"errors"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/dlock/dlock"
	testpki "github.com/dlock/dlock/dlocktest/pki"
	"github.com/dlock/dlock/driver"
)

func TestTLS(t *testing.T) {
	pki := testpki.New(t, "x.test")
	q := url.Values{
		"tls_ca": {pki.CA}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey},
		"tls_server_name": {"x.test"}, "tls_insecure_skip_verify": {"true"},
	}
	p := driver.Params{Q: q, Driver: "test"}
	tp := p.TakeTLS()
	if p.Err != nil || !p.TLS || len(q) != 0 {
		t.Fatalf("TakeTLS: Err %v, TLS %v, left %v; want nil, true, nothing", p.Err, p.TLS, q)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	if err := tp.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	switch {
	case cfg.RootCAs == nil || !cfg.RootCAs.Equal(pki.CAPool):
		t.Error("RootCAs is not the tls_ca pool")
	case len(cfg.Certificates) != 1:
		t.Errorf("%d client certificates, want 1", len(cfg.Certificates))
	case cfg.ServerName != "x.test" || !cfg.InsecureSkipVerify:
		t.Errorf("ServerName %q, InsecureSkipVerify %v; want x.test, true", cfg.ServerName, cfg.InsecureSkipVerify)
	case cfg.MinVersion != tls.VersionTLS13:
		t.Error("Apply changed a field the URL did not set")
	}

	for _, bad := range []url.Values{
		{"tls_cert": {pki.ClientCert}},                   // no key
		{"tls_insecure_skip_verify": {"maybe"}},          // not a boolean
		{"tls_ca": {pki.CA}, "tls_key": {pki.ClientKey}}, // no cert
	} {
		p := driver.Params{Q: bad, Driver: "test"}
		p.TakeTLS()
		if !errors.Is(p.Err, dlock.ErrInvalid) {
			t.Errorf("TakeTLS(%v): Err %v, want ErrInvalid", bad, p.Err)
		}
	}
	for _, tp := range []driver.TLS{
		{CA: filepath.Join(t.TempDir(), "missing.pem")},
		{CA: pki.ClientKey},                        // a key, no certificate
		{Cert: pki.ClientCert, Key: pki.ServerKey}, // not a pair
	} {
		if err := tp.Apply(&tls.Config{}); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Apply(%+v) = %v, want ErrInvalid", tp, err)
		}
	}
}
