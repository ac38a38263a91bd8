package driver

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// The TLS parameters of the drivers' secure schemes (rediss, redlocks, etcds).
const (
	TLSCA         = "tls_ca"                   // PEM file of the CAs to trust instead of the system's
	TLSCert       = "tls_cert"                 // PEM file of a client certificate (with TLSKey)
	TLSKey        = "tls_key"                  // PEM file of its private key (with TLSCert)
	TLSServerName = "tls_server_name"          // the name the server's certificate must carry
	TLSSkipVerify = "tls_insecure_skip_verify" // true: no verification (tests only)
)

// TLS holds the TLS parameters of a URL.
type TLS struct {
	CA, Cert, Key, ServerName string
	SkipVerify                bool
	driver                    string
}

// TakeTLS takes the TLS parameters out of the query; a malformed one, or a
// certificate without its key (or the other way round), is recorded in Err.
func (p *Params) TakeTLS() TLS {
	t := TLS{driver: p.Driver}
	t.CA, _ = p.Take(TLSCA)
	t.Cert, _ = p.Take(TLSCert)
	t.Key, _ = p.Take(TLSKey)
	t.ServerName, _ = p.Take(TLSServerName)
	t.SkipVerify, _ = p.TakeBool(TLSSkipVerify)
	if (t.Cert == "") != (t.Key == "") {
		p.Fail(p.invalid("%s and %s go together", TLSCert, TLSKey))
	}
	return t
}

// Apply loads the files into cfg (RootCAs, Certificates) and sets its
// ServerName and InsecureSkipVerify when the URL gave them, leaving the
// rest of cfg as it was. Errors match ErrInvalid.
func (t TLS) Apply(cfg *tls.Config) error {
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return invalid(t.driver, "%s: %v", TLSCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return invalid(t.driver, "%s: no PEM certificate in %s", TLSCA, t.CA)
		}
		cfg.RootCAs = pool
	}
	if t.Cert != "" {
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return invalid(t.driver, "%s/%s: %v", TLSCert, TLSKey, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if t.ServerName != "" {
		cfg.ServerName = t.ServerName
	}
	if t.SkipVerify {
		cfg.InsecureSkipVerify = true
	}
	return nil
}

func (p *Params) invalid(format string, args ...any) error { return invalid(p.Driver, format, args...) }

// invalid is an ErrInvalid error naming the driver ("" for none).
func invalid(driver, format string, args ...any) error {
	if driver == "" {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	return fmt.Errorf("%w: %s: %s", ErrInvalid, driver, fmt.Sprintf(format, args...))
}
