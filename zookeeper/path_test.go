package zookeeper

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
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

// TestKindQueues: permit nodes are read with their limits, read and write
// nodes (dlock's and Curator's) with their side; each kind's queue holds its
// own nodes only, in sequence order, and guidOf reads dlock's GUID off every
// kind.
func TestKindQueues(t *testing.T) {
	children := []string{
		"_c_bbb-permit-3-0000000010",
		"_c_aaa-permit-12-0000000002",
		"_c_ccc-lock-0000000001",
		"_c_ddd-__WRIT__0000000004",
		"_c_2f8e3b7a-0c1d-4e5f-9a8b-7c6d5e4f3a2b-__READ__0000000003",
		"_c_eee-permit-x-0000000005",
	}
	p := queueOf(dlockdriver.KindPermit, children)
	if len(p) != 2 || p[0].seq != 2 || p[0].limit != 12 || p[1].seq != 10 || p[1].limit != 3 {
		t.Errorf("permit queue %+v, want seq 2 (limit 12) then seq 10 (limit 3)", p)
	}
	rw := queueOf(dlockdriver.KindRead, children)
	if len(rw) != 2 || rw[0].seq != 3 || rw[0].write || rw[1].seq != 4 || !rw[1].write {
		t.Errorf("read/write queue %+v, want a reader (seq 3) then a writer (seq 4)", rw)
	}
	if l := queueOf(dlockdriver.KindLock, children); len(l) != 3 || l[0].seq != 1 {
		// A lock's queue is zk.Lock's: "__" marks a sequence number too, so
		// read and write nodes would count (no lock parent holds them).
		t.Errorf("lock queue %+v", l)
	}
	for child, want := range map[string]string{
		"_c_bbb-permit-3-0000000010": "bbb",
		"_c_ddd-__WRIT__0000000004":  "ddd",
		"_c_fff-__READ__0000000007":  "fff",
		"_c_ccc-lock-0000000001":     "ccc",
		"x-permit-3-0000000001":      "",
	} {
		if got := guidOf(child); got != want {
			t.Errorf("guidOf(%q) = %q, want %q", child, got, want)
		}
	}
	if got := kindPrefix(dlockdriver.KindPermit, "/r/%semaphores/n", "abc", 7); got != "/r/%semaphores/n/_c_abc-permit-7-" {
		t.Errorf("permit prefix %q", got)
	}
	if got := SemaphorePath("", "a/b"); got != "/dlock/%semaphores/a%2Fb" {
		t.Errorf("SemaphorePath = %q", got)
	}
	if got := RWLockPath("/app/", "n"); got != "/app/%rwlocks/n" {
		t.Errorf("RWLockPath = %q", got)
	}
	// No lock name escapes to a namespace's node, and Names skips them.
	for _, space := range []string{semaphoreSpace, rwlockSpace} {
		if _, ok := unescapeName(space); ok {
			t.Errorf("unescapeName(%q) is a lock name", space)
		}
	}
}

// TestPlace: what a listing says of a node, by kind.
func TestPlace(t *testing.T) {
	permits := func(limits ...int) []contender {
		q := make([]contender, len(limits))
		for i, l := range limits {
			q[i] = contender{name: string(rune('a' + i)), seq: int64(i), limit: l}
		}
		return q
	}
	rw := func(sides string) []contender {
		q := make([]contender, len(sides))
		for i, s := range sides {
			q[i] = contender{name: string(rune('a' + i)), seq: int64(i), write: s == 'w'}
		}
		return q
	}
	permit := dlockdriver.Request{Name: "n", Kind: dlockdriver.KindPermit, Limit: 2}
	for _, tc := range []struct {
		what string
		req  dlockdriver.Request
		q    []contender
		i    int
		want verdict
	}{
		{"lock first", dlockdriver.Request{}, permits(0, 0), 0, verdict{granted: true}},
		{"lock second", dlockdriver.Request{}, permits(0, 0), 1, verdict{watch: "a"}},
		{"permit within the limit", permit, permits(2, 2, 2, 2), 1, verdict{granted: true}},
		{"first waiter", permit, permits(2, 2, 2, 2), 2, verdict{children: true}},
		{"second waiter", permit, permits(2, 2, 2, 2), 3, verdict{watch: "c"}},
		{"behind another limit", permit, permits(3, 2), 1, verdict{err: dlockdriver.LimitMismatch("n", 2, 3)}},
		{"before another limit", permit, permits(2, 3), 0, verdict{granted: true}},
		{"reader behind readers", dlockdriver.Request{Kind: dlockdriver.KindRead}, rw("rrr"), 2, verdict{granted: true}},
		{"reader behind a writer", dlockdriver.Request{Kind: dlockdriver.KindRead}, rw("wrwrr"), 4, verdict{watch: "c"}},
		{"writer behind readers", dlockdriver.Request{Kind: dlockdriver.KindWrite}, rw("rrw"), 2, verdict{watch: "b"}},
		{"writer first", dlockdriver.Request{Kind: dlockdriver.KindWrite}, rw("wr"), 0, verdict{granted: true}},
	} {
		got := place(tc.req, tc.q, tc.i)
		if got.granted != tc.want.granted || got.watch != tc.want.watch || got.children != tc.want.children ||
			(got.err == nil) != (tc.want.err == nil) || got.err != nil && got.err.Error() != tc.want.err.Error() {
			t.Errorf("%s: %+v, want %+v", tc.what, got, tc.want)
		}
	}
	if err := place(permit, permits(3, 2), 1).err; !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Errorf("mismatch: %v, want ErrLimitMismatch", err)
	}
}
