package driver

import (
	"context"
	"time"
)

// LockInfo is what a backend can tell about one lock name, for operators
// (dlock inspect) and applications' admin pages. Fields a backend cannot
// tell are zero, except TTL and Waiters, which are -1 when unknown.
type LockInfo struct {
	Name string
	// Held reports whether someone holds the lock now.
	Held bool
	// Token is the first 8 hex digits of the holder's lease token (never
	// the whole token: it authorizes release and refresh), "" when the
	// backend does not store it.
	Token string
	// Metadata is the holder's Options.Metadata, when the backend stores it.
	Metadata string
	// Holder names the holder as the backend knows it (PostgreSQL: the
	// backend pid; ZooKeeper: the session id), when it knows more than the
	// token.
	Holder string
	// Since is when the holder was granted the lock, zero when unknown.
	Since time.Time
	// TTL is the holder's remaining time on the server (until refreshed),
	// -1 when unknown or when the lock lasts as long as a session.
	TTL time.Duration
	// Fence is the holder's fencing token, when HasFence.
	Fence    uint64
	HasFence bool
	// Waiters is how many wait for the lock, -1 when unknown.
	Waiters int
}

// Inspector is implemented by drivers that can describe a lock name
// without taking it. Inspect returns a LockInfo with Held false for a free
// name.
type Inspector interface {
	Inspect(ctx context.Context, name string) (LockInfo, error)
}

// Lister is implemented by Inspectors that can list the names in use (held
// or waited on) that begin with prefix ("" lists every name), in any order.
type Lister interface {
	Names(ctx context.Context, prefix string) ([]string, error)
}

// TokenPrefix is the part of a lease token a LockInfo shows.
func TokenPrefix(token string) string {
	if len(token) > 8 {
		return token[:8]
	}
	return token
}
