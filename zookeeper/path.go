package zookeeper

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
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

// The other kinds' node markers: a permit node carries its semaphore's
// limit after the marker (_c_<guid>-permit-<limit>-<seq>), so that a listing
// shows every holder's limit; read and write nodes are named as Apache
// Curator's InterProcessReadWriteLock names them (_c_<guid>-__READ__<seq>,
// _c_<guid>-__WRIT__<seq>).
const (
	permitMarker = "-permit-"
	readMarker   = "-__READ__"
	writeMarker  = "-__WRIT__"
)

// The namespaces of semaphores and read/write locks under the root. No lock
// name escapes to them (escapeName writes '%' only before two upper-case
// hex digits), and Names skips them.
const (
	semaphoreSpace = "%semaphores"
	rwlockSpace    = "%rwlocks"
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

// SemaphorePath returns the znode that holds the permit nodes of the
// semaphore name for a Locker whose root is root ("" means DefaultRoot):
// root/%semaphores/<escaped name> (see LockPath for the escaping).
func SemaphorePath(root, name string) string { return spacePath(root, semaphoreSpace, name) }

// RWLockPath returns the znode that holds the read and write nodes of the
// read/write lock name for a Locker whose root is root ("" means
// DefaultRoot): root/%rwlocks/<escaped name>. It is the path to give Apache
// Curator's InterProcessReadWriteLock so that it and dlock share the lock.
func RWLockPath(root, name string) string { return spacePath(root, rwlockSpace, name) }

func spacePath(root, space, name string) string {
	if root == "" {
		root = DefaultRoot
	}
	return strings.TrimSuffix(root, "/") + "/" + space + "/" + escapeName(name)
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

// contender is one node of a queue: a lock, permit, read or write node.
type contender struct {
	name  string // the child's name
	seq   int64
	limit int  // a permit node's semaphore limit
	write bool // a write node of a read/write lock
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
			q = append(q, contender{name: c, seq: seq})
		}
	}
	return sortQueue(q)
}

// queueOf returns the nodes of kind k among children in the order they are
// granted (see queue): lock nodes for a lock, permit nodes (with their
// limits) for a semaphore, read and write nodes for a read/write lock.
func queueOf(k dlockdriver.Kind, children []string) []contender {
	switch k {
	case dlockdriver.KindPermit:
		return sortQueue(permits(children))
	case dlockdriver.KindRead, dlockdriver.KindWrite:
		q := make([]contender, 0, len(children))
		for _, c := range children {
			w := strings.Contains(c, writeMarker[1:])
			if !w && !strings.Contains(c, readMarker[1:]) {
				continue
			}
			if seq, ok := parseSeq(c); ok {
				q = append(q, contender{name: c, seq: seq, write: w})
			}
		}
		return sortQueue(q)
	}
	return queue(children)
}

// permits returns the permit nodes among children, unsorted: the children
// named <anything>-permit-<limit>-<seq>.
func permits(children []string) []contender {
	q := make([]contender, 0, len(children))
	for _, c := range children {
		i := strings.LastIndex(c, permitMarker)
		if i < 0 {
			continue
		}
		lim, seq, ok := strings.Cut(c[i+len(permitMarker):], "-")
		if !ok {
			continue
		}
		l, err := strconv.Atoi(lim)
		if err != nil || l < 1 {
			continue
		}
		n, err := strconv.ParseInt(seq, 10, 32)
		if err != nil {
			continue
		}
		q = append(q, contender{name: c, seq: n, limit: l})
	}
	return q
}

func sortQueue(q []contender) []contender {
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

// kindPrefix is the path a node of kind k is created at, as nodePrefix is
// for a lock node: parent/_c_<guid>-permit-<limit>- for a permit,
// parent/_c_<guid>-__READ__ or -__WRIT__ for a side of a read/write lock.
func kindPrefix(k dlockdriver.Kind, parent, guid string, limit int) string {
	switch k {
	case dlockdriver.KindPermit:
		return parent + "/" + protectedPrefix + guid + permitMarker + strconv.Itoa(limit) + "-"
	case dlockdriver.KindRead:
		return parent + "/" + protectedPrefix + guid + readMarker
	case dlockdriver.KindWrite:
		return parent + "/" + protectedPrefix + guid + writeMarker
	}
	return nodePrefix(parent, guid)
}

// guidOf returns the GUID of a protected node name (a lock, permit, read or
// write node), or "".
func guidOf(child string) string {
	rest, ok := strings.CutPrefix(child, protectedPrefix)
	if !ok {
		return ""
	}
	guid, _, ok := strings.Cut(rest, lockMarker)
	if ok {
		return guid
	}
	for _, m := range []string{permitMarker, readMarker, writeMarker} {
		if guid, _, ok := strings.Cut(rest, m); ok {
			return guid
		}
	}
	return ""
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: zookeeper: %s", dlock.ErrInvalid, fmt.Sprintf(format, args...))
}
