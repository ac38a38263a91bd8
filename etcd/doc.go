// Package etcd is the dlock driver for etcd v3: locks that survive a member
// failure and a leader change, granted in FIFO order and fenced by the lock
// key's create revision; semaphores, read/write locks and leader elections
// on the same queue design.
//
//	import _ "github.com/dlock/dlock/etcd"
//
//	locker, err := dlock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks/?ttl=10s")
//
// or, on the application's *clientv3.Client:
//
//	locker, err := etcd.New(client, &etcd.Options{KeyPrefix: "/locks/"})
//
// Guarantees in brief:
//   - Exclusive while valid: lock keys are committed on a Raft quorum and
//     survive a minority of members down, a leader change and a restart.
//   - Fencing: the lock key's create revision, strictly increasing per name.
//   - FIFO with no herd: a waiter makes no read and no watch of its own
//     while it waits; the Locker's one watch tells it when the last older
//     key is gone (behind more than 64 keys, or with LeasePerLock, it
//     watches its predecessor's key).
//   - A holder cut off from the quorum reports the loss at ValidUntil; a dead
//     holder's key lingers up to about half a second past it.
//   - TTLs are whole seconds, at least 1s, raised by etcd to its minimum (2s
//     by default): Lease.TTL reports the TTL granted.
//   - Semaphores (Locker.Semaphore), read/write locks (Locker.RWLock) and
//     leader elections (Locker.Elect): FIFO, notified, fenced by create
//     revision (permits and writers; an election's term); see Primitives.
//
// dlock's locks and concurrency.Mutex / `etcdctl lock` on the same prefix
// exclude each other (see MutexName); so do dlock's read/write locks and
// recipe.RWMutex (see RWMutexName), and dlock's elections and
// concurrency.Election. The sections below are the details.
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
//   - lease_per_lock=true: an etcd lease per lock (Options.LeasePerLock)
//     instead of one per TTL shared by the Locker's locks.
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
// Each lock is a key of its own (named by the lease's token, so that,
// unlike concurrency.Mutex on one session, two leases of one Locker on one
// name exclude each other), bound to the Locker's shared etcd lease of its
// TTL: one etcd lease per Locker and TTL in whole seconds, as
// concurrency.Session has, granted at the first acquisition and again once
// it has expired. An acquisition is one transaction and grants nothing; a
// release is one transaction comparing the key's create revision and
// revokes nothing; acquisitions and releases of different names that meet
// while others are in flight go in one request as nested transactions
// (each with its own comparison and outcome). The shared etcd lease's
// expiry (all of the Locker's refreshes failing for a TTL: a partition, a
// paused process) deletes all its keys, and every lease on it reports the
// loss. What an etcd lease of its own would tell each lock is told by one
// watch per Locker on the key prefix, started from a linearizable read
// before its first key is put: a key deleted, re-created or bound to
// another etcd lease behind its lease's back ends that lease alone, at
// once (before its next refresh); a lock not refreshed within its own TTL
// (NoRefresh, or refreshes failing while others succeed) has its key
// deleted by the Locker within about a quarter second of its TTL's end, as
// etcd would have deleted it; a key put on the shared etcd lease that no
// lease holds (an abandoned attempt's put applied late) is deleted. Close
// revokes the shared etcd leases. Options.LeasePerLock gives each lock an
// etcd lease of its own instead, as before (then a released lease's etcd
// lease is kept, up to 16 per TTL, for the next acquisitions, and Close
// revokes them). The
// etcd lease's TTL is in whole seconds: a TTL is rounded up, and etcd raises
// TTLs below its minimum (1.5 × the election timeout, rounded up: 2s with
// the default configuration). The TTL granted is read back and reported by
// Lease.TTL, and ValidUntil counts from when the request that set the etcd
// lease's expiry was sent (its grant or last keepalive), minus the drift
// margin. Capabilities.MinTTL is 1s.
//
// The watchdog renews the shared etcd lease (once for all the refreshes
// that fall due together) and, in parallel, makes a linearizable read for
// the current revision, then waits until the Locker's watch has delivered
// every change up to it; when the revision has moved outside the prefix
// (the watch sees nothing there), it puts the Locker's marker key and waits
// for that event instead. A refresh vouches for a key only once the watch
// has seen every change made before it was sent, so it never misses a
// deletion. (A requested progress notification would save the write, but
// etcd before 3.4.25 and 3.5.8 may send it ahead of queued events: etcd
// issue 15220.) A
// refresh that finds the etcd lease gone, or the key deleted or replaced,
// reports the loss (the watch has usually reported it already); one that
// keeps failing reports it at ValidUntil. A watch broken by a lost leader
// or a reconnection resumes from the last revision it applied; one whose
// revisions were compacted reads every key the Locker holds, judges each,
// and resumes from that read. With LeasePerLock the watchdog renews each
// lock's etcd lease and reads its key (many keys per transaction). Release and Refresh are transactions comparing the key's
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
// round trip, reads the keys under the name (up to 65, the newest: its own
// and 64 ahead; behind more it waits as with LeasePerLock, below, so that
// joining a long queue costs a bounded reply): each is older than its own,
// and no older key can appear later. It then follows the deletions that
// the Locker's watch on the prefix delivers anyway (see Guarantees), with
// no watch and no read of its own, and holds on the event of the last
// older key's deletion, with no further round trip, whatever deleted them
// (releases, expiries, cancelled waits) and in whatever order; a deletion
// wakes no other waiter's request. When the Locker's watch lost revisions
// to a compaction, each waiter reads its older keys again. With
// LeasePerLock (no Locker watch) a waiter reads its immediate predecessor
// instead and watches only that key's deletion (no herd, no polling): when
// that predecessor was the holder its deletion is the grant, otherwise the
// waiter reads the queue again. A waiter keeps its etcd lease alive while
// it waits. A waiter whose ctx ends, whose key is deleted, or whose etcd
// lease expires (it is then not granted, and returns an error matching
// dlock.ErrNotAcquired), deletes its key before Acquire returns. A
// waiter's own watch (LeasePerLock) broken by a compaction, a lost leader
// or a reconnection is re-established from a fresh read, and the Locker's
// watch resumes from the last revision it applied, so no stale waiter is
// left behind.
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
// created its key; the Locker then deletes the key (with LeasePerLock, and
// for semaphores and read/write locks, it revokes the attempt's etcd lease,
// which deletes the key), and the Locker's watch deletes it again should
// the put be applied after that.
//
// # Primitives
//
// Semaphores and read/write locks are built like the lock: one key per
// lease and per waiter, bound to an etcd lease of its own (never shared:
// the Locker's watch and grouped requests serve locks only), ordered
// by create revision, so everything above (TTLs, refresh and loss,
// release by create revision, expiry, faults, cancelled waits deleting
// their key) holds for them too. Capabilities declares Semaphore,
// PermitFencing, RWLock and Metadata.
//
// Semaphore: the holders of a semaphore of limit L are the L keys with the
// lowest create revisions under its prefix; every other key is a waiter, in
// arrival order (FIFO). Each key's value is the limit, and a key is put
// only if every key already there carries the same value (one transaction
// comparing the values under the prefix), so all keys of a semaphore agree
// on its limit: an acquisition under another limit fails with an error
// matching dlock.ErrLimitMismatch, naming the holders' limit, and puts
// nothing. TryAcquire puts its key only if fewer than L keys are there: one
// transaction on an empty semaphore; otherwise a read, then a transaction
// that puts the key only if no key was created since the read (a deletion
// meanwhile only frees a permit), so it never jumps the queue. A waiter
// puts its key and counts the keys in the same transaction; while L or
// more are older than its own, it watches the deletions under the prefix
// from the revision after its read and counts those of older keys (they go
// away in any order, releases and expiries alike; no older key can
// appear), and holds when fewer than L are left, with no further round
// trip. Every waiter of a semaphore hears every deletion under it (one
// watch event each, no read); a watch broken by a compaction or a lost
// leader is replaced after a fresh count. Options.Metadata is not stored
// for permits (the value is the limit).
//
// Permit fencing: Lease.Fence of a permit is its key's create revision.
// Since a key holds exactly when fewer than L keys are older, and older
// keys only go away, a key never holds before an older one: permits are
// granted in create-revision order, and their tokens strictly increase with
// the grants of the semaphore (Capabilities.PermitFencing). With L > 1,
// up to L holders are valid at once, each with its own token.
//
// Read/write lock: readers' and writers' keys under one prefix (the layout
// of etcd's recipe.RWMutex). A reader holds when no writer's key has a
// lower create revision than its own; a writer when its key is the lowest
// of all. TryRLock puts its key only if there is no writer's key, TryLock
// only if there is no key at all. A waiter watches the deletion of the
// nearest key that blocks it (a reader: the newest older writer's key; a
// writer: the newest older key), reads again when that was not the last
// one, and holds at once when it was. A waiting writer's key keeps every
// later reader out (writers are not starved), readers already holding keep
// the lock until they leave, and a writer that gives up deletes its key,
// which lets the readers behind it in. Fencing covers writers: a writer's
// token is its key's create revision, which increases with every write
// grant of the name (writers hold one after another in create-revision
// order). Readers carry no token. Options.Metadata is the key's value.
//
// Leader election: Locker.Elect is the lock of the election's name with the
// candidate id as the key's value (Capabilities.Metadata): Leader and
// Observe read the lowest key under the name (Inspect), its value is the
// candidate and its create revision the term; Since is zero (etcd records
// revisions, not times). This is the layout of concurrency.Election on
// MutexName: dlock's and etcd's candidates campaign in one queue, and each
// side's Leader names the other's leader. The driver is a Notifier: Observe
// watches deletions under the name and hears a leader's resignation or
// expiry when etcd deletes its key.
//
// # Layout
//
// With P the key prefix (default "dlock/") and N the lock name with every
// "%" written "%25" and every "/" written "%2F" (so that names never nest):
//
//	P N/<token>     one key per lease and per waiter, value Options.Metadata,
//	                bound to the Locker's etcd lease of its TTL (or, with
//	                LeasePerLock, to one of its own); <token> is the
//	                lease's 32-hex-digit token (Lease.Token)
//	P %marker/<id>  a Locker's marker key (one per Locker, <id> random),
//	                put by a batch of refreshes when the revision moved
//	                outside the prefix, bound to a shared etcd lease (gone
//	                with it, and at Close)
//	P %semaphore/N/<token>
//	                a permit's key, holder's or waiter's, value the
//	                semaphore's limit in decimal
//	P %rwlock/N/read/<token>
//	P %rwlock/N/write/<token>
//	                a reader's and a writer's key, holder's or waiter's,
//	                value Options.Metadata
//
// An escaped name never has a path component "%semaphore", "%rwlock" or
// "%marker" (a "%" in it is always followed by "25" or "2F"), so the kinds are
// independent namespaces: a lock, a semaphore and a read/write lock of one
// name never see each other's keys, and Names (dlock inspect) lists locks
// only. recipe.NewRWMutex(session, RWMutexName(P, N)) uses the read/write
// lock's layout (its keys end in a time instead of a token); note that it
// orders keys by mod revision, which a dlock Refresh to a longer TTL moves
// (the key is put again on a new etcd lease), so mix the two only with
// refreshes that keep the TTL.
//
// The holder is the key with the lowest create revision under "P N/". This
// is the layout of go.etcd.io/etcd/client/v3/concurrency.Mutex and of
// `etcdctl lock`, whose keys are "<name>/<lease ID in hex>": a dlock lock on
// N excludes concurrency.NewMutex(session, P+N) and `etcdctl lock P+N`, and
// they exclude it, in one FIFO queue (MutexName computes P+N). Their keys
// are told apart from dlock's by length. Nothing else is stored, and nothing
// stays behind once a name's leases and waiters are gone, in any of the
// three namespaces (the fencing token needs no counter: revisions only
// grow).
//
// Deleting these keys by hand breaks the lock like deleting any lock's
// state: a holder whose key is deleted learns it at its next refresh and
// reports the loss. A waiter whose key is deleted is not granted (with
// LeasePerLock, a waiter watches its predecessor's key, not its own, and a
// waiter granted after its key was deleted reports the loss).
package etcd
