// Package etcd is the dlock driver for etcd v3, built on
// go.etcd.io/etcd/client/v3: a FIFO queue of keys bound to etcd leases, with
// the lock key's create revision as the fencing token.
//
// # URLs
//
//	etcd://[user:pass@]host1:2379[,host2:2379,…][/prefix][?params]
//	etcds://[user:pass@]host1:2379[,…][/prefix]?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem
//
// The hosts are the client endpoints (port 2379 when left out; an IPv6
// address in brackets only as the single host, as URLs allow); etcds dials
// them with TLS. The path, when there is one, is the key prefix, verbatim
// (etcd://h:2379/locks/ gives "/locks/"); without one it is "dlock/".
// User and password turn on etcd authentication. ParseURL gives the client
// configuration a URL stands for, for a client or a concurrency.Session of
// one's own.
//
// Parameters:
//
//   - The lock options of dlock.Options: ttl, refresh, refresh_interval,
//     retry_min, retry_max, metadata (see dlock.OptionsFromQuery).
//   - dial_timeout (default 5s): bounds connecting and authenticating, at
//     Open and when reconnecting; Open's ctx bounds Open too.
//   - dial_keep_alive_time, dial_keep_alive_timeout (default off): gRPC
//     keepalive pings, which find a silently dead endpoint and move to
//     another. etcd refuses pings more often than every 5s by default.
//   - auto_sync_interval (default off): refresh the endpoint list from the
//     cluster's member list. Off, the client talks only to the URL's hosts.
//   - etcds only: tls_ca (PEM file of CA certificates to trust instead of the
//     system's), tls_cert and tls_key (PEM files of a client certificate and
//     its key, both or neither), tls_server_name (the name to verify the
//     server's certificate against; default each endpoint's host),
//     tls_insecure_skip_verify=true (no verification: tests only).
//
// Unknown parameters are rejected. Open makes one read under the prefix,
// bounded by its ctx, so a wrong address, credential or permission fails
// there; the Locker then owns the client it made (its logger discards
// everything) and closes it on Close.
//
// With authentication, the user needs read and write permission on the
// prefix; revoking the etcd leases of cancelled attempts needs it too.
//
// # Guarantees
//
// etcd is a Raft-replicated store: a lock key is committed on a quorum
// before anyone is granted, and survives the loss of a minority of members,
// a leader change and a restart (Capabilities.SurvivesRestart). While a
// lease is valid (until its ValidUntil) nobody else holds its name.
//
// Each lease is a key bound to an etcd lease of its own (never shared with
// another lock, so an etcd lease's expiry is exactly one lock's loss; and,
// unlike concurrency.Mutex on one session, two leases of one Locker on one
// name exclude each other). A released lease's etcd lease is kept by the
// Locker (up to 16 per TTL) for its next acquisitions, so that an
// uncontended acquire and a release cost one transaction each; Close
// revokes them. The
// etcd lease's TTL is in whole seconds: a TTL is rounded up, and etcd raises
// TTLs below its minimum (1.5 × the election timeout, rounded up: 2s with
// the default configuration). The TTL granted is read back and reported by
// Lease.TTL, and ValidUntil counts from when the request that set the etcd
// lease's expiry was sent (its grant or last keepalive), minus the drift
// margin. Capabilities.MinTTL is 1s.
//
// The watchdog renews the etcd lease (KeepAliveOnce) and, in parallel, reads
// the key to check that it still exists with this lease's create revision
// and etcd lease: a refresh that finds the etcd lease gone, or the key
// deleted or replaced, reports the loss at once (within a third of the TTL
// of the deletion, with the default refresh interval); one that keeps
// failing reports it at ValidUntil. Release and Refresh are transactions comparing the key's
// create revision, so a retried release can never delete a newer holder's
// key, and a lost lock is never re-created: Release of a lost lease reports
// ErrNotHeld. A Refresh to a longer TTL moves the key to a new etcd lease in
// one such transaction; a Refresh to a shorter TTL keeps the current etcd
// lease and reports its longer TTL.
//
// Acquisition is a FIFO queue (Capabilities.FIFO): the holder is the key
// with the lowest create revision under the name. TryAcquire is one
// transaction that creates the key only if there is no key under the name at
// all, so it never jumps the queue. A waiter puts its key and, in the same
// round trip, reads its immediate predecessor; it watches only that key's
// deletion (no herd, no polling) and keeps its own etcd lease alive while it
// waits. When the predecessor it watches was the holder, its deletion is the
// grant, with no further round trip. A waiter whose ctx ends, or whose etcd
// lease expires (it is then not granted, and returns an error matching
// dlock.ErrNotAcquired), deletes its key before Acquire returns. A watch
// broken by a compaction, a lost leader or a reconnection is re-established
// from a fresh read, so no stale waiter is left behind.
//
// Fencing: Lease.Fence is the lock key's create revision, which strictly
// increases with every grant of the name (never the etcd lease ID).
//
// Expiry: etcd revokes expired etcd leases in a loop that runs every 500ms,
// so the key of a holder that died lingers up to about half a second past
// its ValidUntil (Capabilities.ExpirySlack is 1s). A new leader restarts
// every etcd lease's countdown at its full TTL (plus an election timeout)
// when it takes over, so after a leader change a dead holder's lock may last
// up to one more TTL. Neither delays the loss signal of a holder that is
// alive, which comes no later than ValidUntil.
//
// Faults: a leader failover while a lease is held keeps it (same key, same
// fence) as long as a keepalive gets through before ValidUntil, which a
// failover well within the TTL allows. A holder cut off from the quorum
// (partitioned, or the quorum lost) cannot renew and reports the loss at
// ValidUntil; while there is no quorum nobody can be granted anything. The
// etcd lease is as safe as etcd's lessor: a leader stalled for longer than
// the TTL (a slow disk) may revoke leases whose keepalives it did not get
// to (etcd issue 15247).
//
// Process pauses: a holder paused past its ValidUntil may resume believing it
// holds a lock that expired and was taken; pass Lease.Fence to the protected
// resource so that it can refuse the stale holder's writes.
//
// An attempt cut short by its ctx after its request went out may still have
// created its key; the Locker then revokes that attempt's etcd lease, which
// deletes the key.
//
// # Layout
//
// With P the key prefix (default "dlock/") and N the lock name with every
// "%" written "%25" and every "/" written "%2F" (so that names never nest):
//
//	P N/<token>     one key per lease and per waiter, value Options.Metadata,
//	                bound to an etcd lease of its own; <token> is the
//	                lease's 32-hex-digit token (Lease.Token)
//
// The holder is the key with the lowest create revision under "P N/". This
// is the layout of go.etcd.io/etcd/client/v3/concurrency.Mutex and of
// `etcdctl lock`, whose keys are "<name>/<lease ID in hex>": a dlock lock on
// N excludes concurrency.NewMutex(session, P+N) and `etcdctl lock P+N`, and
// they exclude it, in one FIFO queue (MutexName computes P+N). Their keys
// are told apart from dlock's by length. Nothing else is stored, and nothing
// stays behind once a name's locks and waiters are gone (the fencing token
// needs no counter: revisions only grow).
//
// Deleting these keys by hand breaks the lock like deleting any lock's
// state: a holder whose key is deleted learns it at its next refresh and
// reports the loss; so does a waiter granted after its key was deleted
// while it waited (a waiter watches its predecessor's key, not its own).
package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultKeyPrefix is the key prefix when none is given.
const DefaultKeyPrefix = "dlock/"

// MinTTL is the shortest TTL the driver accepts: etcd leases count in whole
// seconds. The server may raise it further (see the package doc).
const MinTTL = time.Second

// ExpirySlack is how long after a dead holder's ValidUntil its key may still
// be there: etcd revokes expired leases every 500ms.
const ExpirySlack = time.Second

// Options configure a Locker. A nil *Options means all defaults.
type Options struct {
	// Defaults are the Locker's default lock options (URL: ttl, refresh,
	// refresh_interval, retry_min, retry_max, metadata). Zero fields mean the
	// defaults documented on dlock.Options.
	Defaults dlock.Options

	// KeyPrefix starts every key (URL: the path). Default "dlock/". It is
	// used verbatim: end it with "/" to keep it apart from other keys.
	KeyPrefix string
}

// New returns a Locker on the application's client. Closing the Locker does
// not close the client.
func New(client *clientv3.Client, opts *Options) (*dlock.Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: etcd: nil client", dlock.ErrInvalid)
	}
	d := newDriver(client, opts, false)
	return dlock.New(d, &d.defaults)
}

// newDriver returns the driver. open passes a nil client, which Ping makes
// once the options are known to be valid.
func newDriver(client *clientv3.Client, opts *Options, ownsClient bool) *driver {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	d := &driver{
		c:          client,
		prefix:     o.KeyPrefix,
		ownsClient: ownsClient,
		pool:       make(map[int64][]*lease),
		attempts:   make(map[string]*lease),
	}
	d.defaults = o.Defaults
	return d
}

// MutexName returns the name under which concurrency.NewMutex and `etcdctl
// lock` contend with dlock's lock on name, for the given key prefix ("" for
// the default).
func MutexName(keyPrefix, name string) string {
	if keyPrefix == "" {
		keyPrefix = DefaultKeyPrefix
	}
	return keyPrefix + escape(name)
}

// escape writes "%" as "%25" and "/" as "%2F", so that no name's keys lie
// under another's prefix.
func escape(name string) string {
	if !strings.ContainsAny(name, "%/") {
		return name
	}
	return strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
}

type driver struct {
	c          *clientv3.Client
	prefix     string
	ownsClient bool
	defaults   dlock.Options    // New's Options.Defaults
	cfg        *clientv3.Config // opened from a URL: Ping makes c from it
	addr       string           // the redacted URL, when opened from one

	mu       sync.Mutex
	closed   bool
	pool     map[int64][]*lease // idle etcd leases by TTL in seconds
	attempts map[string]*lease  // by token: failed TryAcquires, for Abandon
	bg       sync.WaitGroup     // revocations in flight
}

func (d *driver) Capabilities() dlock.Capabilities {
	return dlock.Capabilities{
		Fencing:         true,
		FIFO:            true,
		NotifiedWait:    true,
		MinTTL:          MinTTL,
		SurvivesRestart: true,
		ExpirySlack:     ExpirySlack,
	}
}

// keys are a lock's queue prefix and one lease's key under it.
type keys struct {
	prefix string // P N/
	key    string // P N/<token>
}

func (d *driver) keys(name, token string) keys {
	p := d.prefix + escape(name) + "/"
	return keys{prefix: p, key: p + token}
}

// TryAcquire is one transaction: put the key if there is no key at all under
// the name.
func (d *driver) TryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	k := d.keys(req.Name, req.Token)
	for retried := false; ; retried = true {
		l, err := d.takeLease(ctx, seconds(req.TTL))
		if err != nil {
			return nil, fmt.Errorf("etcd: granting a lease for %q: %w", k.prefix, err)
		}
		resp, err := d.c.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k.prefix), "=", 0).WithPrefix()).
			Then(clientv3.OpPut(k.key, req.Metadata, clientv3.WithLease(l.id))).
			Commit()
		if err != nil {
			if leaseGone(err) && !retried {
				continue // an idle lease was revoked behind our back
			}
			d.mu.Lock()
			d.attempts[req.Token] = l
			d.mu.Unlock()
			return nil, fmt.Errorf("etcd: acquiring %q: %w", k.prefix, err)
		}
		if !resp.Succeeded {
			d.putLease(l)
			return nil, dlockdriver.Busy(0)
		}
		return d.grant(k, resp.Header.Revision, req.Metadata, l), nil
	}
}

func (d *driver) grant(k keys, rev int64, value string, l *lease) *dlockdriver.Grant {
	return &dlockdriver.Grant{
		Handle: &handle{d: d, key: k.key, rev: rev, value: value, l: l},
		Fence:  uint64(rev),
		TTL:    l.granted,
		Sent:   l.lastSent(),
	}
}

// Abandon revokes the etcd lease of an attempt that may have created its key
// (which goes with it), or deletes the key when the attempt did not get as
// far as a lease.
func (d *driver) Abandon(ctx context.Context, req dlockdriver.Request) error {
	d.mu.Lock()
	l := d.attempts[req.Token]
	delete(d.attempts, req.Token)
	d.mu.Unlock()
	k := d.keys(req.Name, req.Token)
	if l != nil {
		if _, err := d.c.Revoke(ctx, l.id); err != nil && !leaseGone(err) {
			return fmt.Errorf("etcd: abandoning an attempt on %q: %w", k.prefix, err)
		}
		return nil
	}
	if _, err := d.c.Delete(ctx, k.key); err != nil {
		return fmt.Errorf("etcd: abandoning an attempt on %q: %w", k.prefix, err)
	}
	return nil
}

func (d *driver) Close() error {
	d.drainPool()
	d.bg.Wait() // bounded by revokeTimeout
	if d.ownsClient && d.c != nil {
		if err := d.c.Close(); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("etcd: closing the client: %w", err)
		}
	}
	return nil
}
