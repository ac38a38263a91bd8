package faultnet

import "testing"

// ListenT is Listen for a test: it fails tb when the proxy cannot listen,
// and closes the proxy when the test ends.
func ListenT(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := Listen(target)
	if err != nil {
		tb.Fatalf("faultnet: proxy to %s: %v", target, err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}
