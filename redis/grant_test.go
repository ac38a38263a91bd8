package redis

import "testing"

func TestParseGrant(t *testing.T) {
	for _, tc := range []struct {
		in    string
		token string
		fence uint64
		ok    bool
	}{
		{"g:ab:12", "ab", 12, true},
		{"g:a:b:7", "a:b", 7, true},
		{"", "", 0, false},
		{"g:ab", "", 0, false},
		{"g:ab:0", "", 0, false},
		{"g:ab:x", "", 0, false},
		{"x:ab:1", "", 0, false},
	} {
		token, fence, ok := parseGrant(tc.in)
		if token != tc.token || fence != tc.fence || ok != tc.ok {
			t.Errorf("parseGrant(%q) = %q, %d, %v; want %q, %d, %v", tc.in, token, fence, ok, tc.token, tc.fence, tc.ok)
		}
		if key, ok := routeMessage(tc.in); key != tc.token || ok != tc.ok {
			t.Errorf("routeMessage(%q) = %q, %v", tc.in, key, ok)
		}
	}
	// A steal message is no waiter's: it goes to the steal channel's
	// listener.
	for _, in := range []string{"t:ab", "t:a:b:1", "t:"} {
		if key, ok := routeMessage(in); ok {
			t.Errorf("routeMessage(%q) = %q, true; want false", in, key)
		}
	}
}
