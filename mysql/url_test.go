package mysql_test

import (
	neturl "net/url"
	"testing"
)

func mustURL(t testing.TB, s string) *neturl.URL {
	t.Helper()
	u, err := neturl.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
