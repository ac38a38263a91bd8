package zookeeper

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/dlock/dlock"
)

// DefaultRoot is the znode under which lock nodes live by default.
const DefaultRoot = "/dlock"

// lockPrefix is what a lock node's name starts with before its sequence
// number, after the protected-create prefix and the GUID: the layout of
// Apache Curator's InterProcessMutex and go-zookeeper's zk.Lock.
const (
	protectedPrefix = "_c_"
	lockMarker      = "-lock-"
)

// LockPath returns the znode that holds the lock nodes of name for a Locker
// whose root is root ("" means DefaultRoot): the path to give go-zookeeper's
// zk.NewLock or Curator's InterProcessMutex so that they and dlock exclude
// each other on that name.
//
// The name is escaped into one path component: every byte outside the
// printable ASCII range, and '/', '%' and space, becomes %XX (upper-case
// hex), and a name of "." or ".." has its dots escaped too. Distinct names
// give distinct paths, and every name dlock accepts gives a valid path.
func LockPath(root, name string) string {
	if root == "" {
		root = DefaultRoot
	}
	return strings.TrimSuffix(root, "/") + "/" + escapeName(name)
}

func escapeName(name string) string {
	var b strings.Builder
	b.Grow(len(name))
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c > ' ' && c < 0x7f && c != '/' && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	s := b.String()
	if s == "." || s == ".." {
		s = strings.Repeat("%2E", len(s))
	}
	return s
}

// checkRoot validates a root znode path: absolute, no empty, "." or ".."
// component, no trailing slash, not "/" itself (lock names would then sit
// beside /zookeeper), not under /zookeeper.
func checkRoot(root string) error {
	if root == "/" || !strings.HasPrefix(root, "/") || strings.HasSuffix(root, "/") {
		return invalid("root %q must be an absolute znode path other than /, without a trailing slash", root)
	}
	for _, part := range strings.Split(root[1:], "/") {
		if part == "" || part == "." || part == ".." {
			return invalid("root %q has an empty, . or .. component", root)
		}
		for _, r := range part {
			if r < ' ' || r >= 0x7f && r <= 0x9f || r >= 0xf000 && r <= 0xf8ff || r >= 0xfff0 && r <= 0xffff {
				return invalid("root %q has a character ZooKeeper rejects", root)
			}
		}
	}
	if root == "/zookeeper" || strings.HasPrefix(root, "/zookeeper/") {
		return invalid("root %q is inside ZooKeeper's own /zookeeper", root)
	}
	return nil
}

// nodePrefix is the path a lock node is created at (the server appends the
// sequence number): parent/_c_<guid>-lock-.
func nodePrefix(parent, guid string) string {
	return parent + "/" + protectedPrefix + guid + lockMarker
}

// contender is one lock node under a name's parent.
type contender struct {
	name string // the child's name
	seq  int64
}

// parseSeq returns the sequence number of a lock node name, as zk.Lock reads
// it: the number after the last "lock-" (dlock, zk.Lock, Curator), or after
// the last "__" (the Python client's "__lock__"). ok is false for a child that
// is not a lock node.
func parseSeq(child string) (seq int64, ok bool) {
	i := strings.LastIndex(child, "lock-")
	if i >= 0 {
		i += len("lock-")
	} else if i = strings.LastIndex(child, "__"); i >= 0 {
		i += len("__")
	} else {
		return 0, false
	}
	n, err := strconv.ParseInt(child[i:], 10, 32)
	if err != nil {
		return 0, false
	}
	return n, true
}

// queue returns the lock nodes among children in the order they are
// granted: by sequence number, then by name.
func queue(children []string) []contender {
	q := make([]contender, 0, len(children))
	for _, c := range children {
		if seq, ok := parseSeq(c); ok {
			q = append(q, contender{c, seq})
		}
	}
	slices.SortFunc(q, func(a, b contender) int {
		if a.seq != b.seq {
			if a.seq < b.seq {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	return q
}

// guidOf returns the GUID of a protected node name, or "".
func guidOf(child string) string {
	rest, ok := strings.CutPrefix(child, protectedPrefix)
	if !ok {
		return ""
	}
	guid, _, ok := strings.Cut(rest, lockMarker)
	if !ok {
		return ""
	}
	return guid
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: zookeeper: %s", dlock.ErrInvalid, fmt.Sprintf(format, args...))
}
