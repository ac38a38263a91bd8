package faultnet

// TB is the part of testing.TB that ListenT uses. It is an interface of its
// own so that faultnet does not import package testing: programs that use
// the proxies outside tests (dlock bench faults) do not link it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// ListenT is Listen for a test: it fails tb (a *testing.T, *testing.B or
// testing.TB) when the proxy cannot listen, and closes the proxy when the
// test ends.
func ListenT(tb TB, target string) *Proxy {
	tb.Helper()
	p, err := Listen(target)
	if err != nil {
		tb.Fatalf("faultnet: proxy to %s: %v", target, err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}
