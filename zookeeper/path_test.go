package zookeeper

import (
	"net/url"
	"strings"
	"testing"
)

func TestLockPath(t *testing.T) {
	for _, tc := range []struct{ root, name, want string }{
		{"", "orders", "/dlock/orders"},
		{"/app/locks", "a/b", "/app/locks/a%2Fb"},
		{"", "50% off", "/dlock/50%25%20off"},
		{"", ".", "/dlock/%2E"},
		{"", "..", "/dlock/%2E%2E"},
		{"", "...", "/dlock/..."},
		{"", "zookeeper", "/dlock/zookeeper"},
		{"", "über\x01\x7f", "/dlock/%C3%BCber%01%7F"},
		{"", "_c_x-lock-0000000001", "/dlock/_c_x-lock-0000000001"},
	} {
		if got := LockPath(tc.root, tc.name); got != tc.want {
			t.Errorf("LockPath(%q, %q) = %q, want %q", tc.root, tc.name, got, tc.want)
		}
	}
	// One component, and decoding gives the name back: distinct names never
	// share a path.
	for _, name := range []string{"a/b", "a%2Fb", "%", " ", "鍵/../x", "\\", "a\tb"} {
		e := escapeName(name)
		if strings.ContainsAny(e, "/ ") {
			t.Errorf("escapeName(%q) = %q: not one clean component", name, e)
		}
		if back, err := url.PathUnescape(e); err != nil || back != name {
			t.Errorf("escapeName(%q) = %q decodes to %q, %v", name, e, back, err)
		}
	}
}

func TestQueueOrder(t *testing.T) {
	q := queue([]string{
		"_c_bbb-lock-0000000010",
		"not-a-lock-node",
		"_c_2f8e3b7a-0c1d-4e5f-9a8b-7c6d5e4f3a2b-lock-0000000002",
		"9f1e__lock__0000000003",
		"_c_aaa-lock-0000000001",
	})
	var got []int64
	for _, c := range q {
		got = append(got, c.seq)
	}
	if want := []int64{1, 2, 3, 10}; len(got) != len(want) || got[0] != 1 || got[1] != 2 || got[2] != 3 || got[3] != 10 {
		t.Fatalf("queue order %v, want %v", got, want)
	}
	if g := guidOf("_c_2f8e3b7a-0c1d-4e5f-9a8b-7c6d5e4f3a2b-lock-0000000002"); g != "2f8e3b7a-0c1d-4e5f-9a8b-7c6d5e4f3a2b" {
		t.Errorf("guidOf a Curator node = %q", g)
	}
}

func TestCheckRoot(t *testing.T) {
	for _, root := range []string{"/dlock", "/a/b", "/a b"} {
		if err := checkRoot(root); err != nil {
			t.Errorf("checkRoot(%q): %v", root, err)
		}
	}
	for _, root := range []string{"", "/", "dlock", "/a/", "/a//b", "/a/../b", "/zookeeper", "/zookeeper/x", "/a\x01"} {
		if err := checkRoot(root); err == nil {
			t.Errorf("checkRoot(%q): no error", root)
		}
	}
}
