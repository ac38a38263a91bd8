// Package redis is the dlock driver for a single Redis server (or one
// primary with replicas), built on github.com/redis/go-redis/v9: the fastest
// backend, with fencing tokens and FIFO handoff to queued waiters.
//
//	import _ "github.com/dlock/dlock/redis"
//
//	locker, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?ttl=10s")
//
// or, on the application's client:
//
//	locker, err := redis.New(client, nil)
//
// where client is a *goredis.Client (one server, or Sentinel) or a
// *goredis.ClusterClient, made with ContextTimeoutEnabled (see Clients).
//
// This package is named redis, as is go-redis's: code that imports both
// names go-redis goredis (as this package and its examples do), because
// users write redis.New for the lock and goredis.NewClient for the client.
//
// Guarantees in brief:
//   - Exclusive while valid on the one node that decides; a failover to an
//     asynchronously replicated replica can lose or duplicate a lock.
//   - Fencing: a counter per name, incremented in the acquiring script; it
//     keeps increasing across a restart without persistence (see Fencing).
//   - FIFO: the release script hands the lock to the next queued waiter.
//   - Locks survive a restart only with AOF persistence.
//   - compat=true shares keys with redsync and bsm/redislock (no fencing,
//     no FIFO), for a migration without a flag day.
//   - Default layout only: semaphores (with fencing tokens), read/write
//     locks (writers fenced, waiting writers keep new readers out), and
//     lock metadata, hence leader election (see Semaphores, read/write
//     locks and elections).
//
// The sections below are the details.
//
// # URLs
//
//	redis://[user:pass@]host:port[/db][?params]
//	rediss://[user:pass@]host:port[/db]?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem
//
// Parameters:
//
//   - The lock options of dlock.Options: ttl, refresh, refresh_interval,
//     retry_min, retry_max, metadata (see dlock.OptionsFromQuery).
//   - prefix=app: sets Options.KeyPrefix; compat=true sets Options.Compat.
//   - rediss only: tls_ca (PEM file of CA certificates to trust instead of
//     the system's), tls_cert and tls_key (PEM files of a client
//     certificate and its key, both or neither), tls_server_name (the name
//     to verify the server's certificate against; default the URL's host),
//     tls_insecure_skip_verify=true (no verification: tests only). go-redis's
//     own skip_verify is accepted too.
//   - Everything go-redis's ParseURL accepts: dial_timeout, read_timeout,
//     write_timeout, pool_size, max_retries, client_name, protocol, …
//
// An ACL user needs the scripting commands, the keys ~P* and, for notified
// waiting, the channels &P* (P the key prefix). Without rights on the
// channels, locks still work: releases do not announce themselves and waiters
// poll between RetryMin and RetryMax.
//
// Unknown parameters are rejected. Open pings the server, bounded by its ctx,
// so a wrong address or credential fails there; the Locker then owns the
// client it made and closes it on Close. The client honours context deadlines
// (ContextTimeoutEnabled).
//
// # Clients
//
// New takes the application's go-redis client: a *goredis.Client (one
// server, or Sentinel through goredis.NewFailoverClient) or a
// *goredis.ClusterClient (a lock's keys share one hash slot; releases and
// grants are PUBLISHed, which a cluster delivers to every node). Both are
// tested against real servers, a Sentinel failover included. The client
// must have ContextTimeoutEnabled, or New returns dlock.ErrInvalid: without
// it go-redis ignores ctx deadlines. A *goredis.Ring is refused with
// dlock.ErrInvalid: it moves keys between shards when a client's health
// check fails, which would let two holders take one lock (see New).
//
// # Guarantees
//
// One Redis node decides: a lease is exclusive while it is valid (until its
// ValidUntil), because the lock key lives on that node for the TTL and only
// the token's owner can extend or delete it. Release and Refresh compare the
// token first, so they never touch another holder's lock, and Refresh never
// re-creates a lock that expired.
//
// What it does not survive:
//
//   - Failover: Redis replicates asynchronously, so a replica promoted after
//     a primary crash may lack a lock that was granted (two holders), or
//     still have one that was released. Protect the resource with the
//     fencing token (Lease.Fence). The counter is replicated asynchronously
//     too, so after a failover it may hand out a token again; a resource
//     that accepts only tokens above the highest it has seen then refuses
//     the second holder's writes instead of interleaving them.
//   - Restart: the test and reference servers run without persistence, so a
//     restart forgets every lock (a holder and the next taker may then both
//     hold a valid lease) and every fencing counter. Fencing tokens still
//     strictly increase across it, because a missing counter starts again at
//     the server's clock (see Fencing). With AOF (appendonly yes, appendfsync
//     always) locks and counters survive a restart; Capabilities reports
//     SurvivesRestart false because that depends on the server's
//     configuration.
//   - Process pauses: a holder paused (GC, SIGSTOP, a VM migration) past its
//     ValidUntil may resume believing it holds a lock that expired and was
//     taken. The lease reports the loss, but only once the process runs
//     again; pass Lease.Fence to the resource so that it can refuse the stale
//     holder's writes.
//
// Fencing (default layout): every grant, a handoff to a queued waiter or an
// expiry takeover included, advances the name's counter in the script that
// sets the lock, and the lease's token (Lease.Fence) is the new value. A
// counter that exists is INCRed. A missing one (the name's first use, or
// lost: a restart without persistence, an eviction under an allkeys-*
// maxmemory policy, a DEL) starts at the server's TIME in microseconds. A
// counter grows by one per grant and a grant costs at least one script run
// on the server, which takes longer than a microsecond, so a counter never
// outruns the microseconds elapsed since it started; a lost counter therefore
// starts again above every token handed out before it was lost, provided the
// server's clock has not gone back since by more than the time that passed.
// The assumption is the server's clock: let NTP slew it, not step it back.
// Tokens are then microsecond-scale numbers (about 1.8e15 in 2026), far
// inside a uint64 and exact in Lua's numbers until 2^53 (the year 2255). A
// counter of an older version, started at 1, keeps counting from its value;
// it jumps to the clock only when it is lost. So tokens keep increasing
// across a restart, but not across a failover to a replica that has a stale
// counter (above).
//
// Default layout: waiting is a FIFO queue on the server (Capabilities.FIFO).
// A waiter enqueues itself (in the order the server sees its requests) and
// keeps its entry alive; a release hands the lock straight to the first
// live waiter (the release script sets the lock to that waiter's token and
// counts its fence) and PUBLISHes a grant message on the channel of that
// waiter's Locker, which hands it to that waiter alone: no herd (a grant
// reaches one connection, however many processes wait), and no further
// round trip before the waiter holds it.
// A holder that expires without releasing is taken over by the first live
// waiter, whichever waiter (or TryAcquire) finds the lock free first: a
// TryAcquire never takes a lock ahead of a live waiter, and never enqueues.
// A waiter whose ctx ends leaves the queue (and passes on a lock handed to it
// meanwhile) before Acquire returns, waiting up to 250ms for the server.
// A dead waiter (crashed, partitioned) is skipped once its entry has
// expired; until then a release may hand it the lock, which then stays idle
// for that lock's TTL plus at most a third of the next waiter's entry
// lifetime (see Layout). Fencing tokens count every handoff.
//
// Compat layout: waiting is notified: releases PUBLISH on a channel that
// waiters subscribe to, so a waiter retries as soon as the lock is released.
// A lock that expires without a release publishes nothing; waiters then
// retry when the holder's remaining TTL (read with the failed attempt) has
// passed. Locks are not granted in arrival order.
//
// Both use one pub/sub connection per Locker. A channel stays subscribed
// for 2s after its last waiter left (at most 1024 channels at a
// time), so that a name taken in a loop costs no SUBSCRIBE per wait. If the
// connection fails, waiters are woken to look again (a default-layout waiter
// finds there a lock handed to it meanwhile), the connection is replaced and
// the channels subscribed again; meanwhile they retry at the holder's
// remaining TTL. A connection that stays silent is found out by PING within
// seconds. A default-layout waiter that cannot subscribe at all (no rights on
// the channel) stays queued and runs the acquire script at least every
// 200ms to find a lock handed to it.
//
// Many leases: the watchdog refreshes a Locker's leases in batches (one
// script call per up to 256 leases on one server, a pipeline of them on
// Cluster), one pool connection at a time, so 10,000 held leases need the
// pub/sub connection and one pool connection. The pool keeps the
// connections that concurrent acquisitions opened (16 goroutines acquiring
// at once leave 16); go-redis closes an idle one only when it takes it
// again, so bound them with max_idle_conns (e.g. 4) when a burst of
// acquisitions should not leave connections open, at the price of dialling
// again whenever the concurrency comes back: 8 goroutines locking with up
// to 2ms of work under each lock dialled 1,294 times in 5s with
// max_idle_conns=4 (9 times without) and managed 44% fewer locks a second,
// which is why it is not the default.
//
// A key without expiry under a lock's name (set by something else) counts as
// held; compat waiters then poll it at Options.RetryMax, default-layout
// waiters at the renewal interval of their entry.
//
// An attempt cut short by its ctx after the request went out may still have
// taken the lock; the Locker then removes it in the background with the
// release script and that attempt's own token, so it does not linger until
// its TTL (unless the request itself arrives after the removal).
//
// # Layout
//
// Default layout, with P the key prefix (default "dlock:") and N the lock name:
//
//	P{N}            string: the lease token, with the TTL as its expiry
//	                (SET NX PX); deleted on release
//	P{N}:fence      integer: the fencing counter, advanced with every grant
//	                in the same script as the SET: INCRed, or started at
//	                the server's TIME in µs when missing (see Fencing)
//	P{N}:queue      sorted set: the waiting tokens, scored by arrival (the
//	                server's TIME in µs at the first enqueue; renewals keep
//	                the place)
//	P{N}:waiters    hash: token -> "deadline_ms ttl_ms channel", a waiter's
//	                entry: live until deadline (server time), renewed by the
//	                waiter; the TTL is the one the waiter asked for; the
//	                grant channel of the waiter's Locker
//	Pgrants:<id>    pub/sub channel of one Locker (id: 64 random bits):
//	                "g:<token>:<fence>" when a release or an expiry takeover
//	                hands a lock to one of its waiters
//	P{N}:released   pub/sub channel: an empty message on a release that
//	                found only dead entries queued (nothing when the queue is
//	                empty: nobody waits then)
//
// A waiter's entry lives lifetime = max(TTL, 1s) after its last renewal;
// waiting, it renews it at least every lifetime/3. Dead entries are dropped
// when they reach the head of the queue. The queue and the hash vanish when
// their last entry is removed (Redis deletes empty sets and hashes), and
// carry an expiry at least as late as every entry's deadline, so entries
// of waiters that died vanish even when no one comes to remove them.
//
// The counter's value is always the current holder's fence (every grant
// SETs the lock and advances the counter in one script, nothing else changes
// either): a waiter that missed its grant message finds the lock holding
// its token and reads its fence there.
//
// The braces make N (up to any "}" in it) the hash tag, so a lock, its
// counter and its queue share a cluster slot. The counter persists by design: it is one
// small key per name ever locked, and it is what makes fencing tokens
// strictly increase across holders and expiry takeovers. A counter deleted
// (or evicted) starts again at the server's clock, so deleting one does not
// break fencing under the clock assumption above, but every deleted counter
// is one more place that assumption must hold.
//
// Compat layout (Options.Compat, URL compat=true), with P defaulting to "":
//
//	PN              string: the lease token, SET NX PX, compare-and-delete
//	PN:released     pub/sub channel: an empty message on every release
//
// This is the layout of github.com/go-redsync/redsync/v4 (one pool) and
// github.com/bsm/redislock, so dlock, redsync and redislock locks on the same
// name exclude each other. There is no fencing counter, so Capabilities
// reports no Fencing. redsync and redislock do not publish when they release:
// a dlock waiter behind one of their locks retries at the holder's remaining
// TTL.
//
// Lock metadata (Options.Metadata), default layout only, with the same P
// and N, in N's slot:
//
//	P{N}:meta       string: "<token>\n<since_ms>\n<metadata>" of a holder
//	                with metadata, with the lock's expiry (set by the grant,
//	                extended by the refresh, deleted by the release); no key
//	                for a holder without metadata
//
// and, while a waiter with metadata is queued, its entry in P{N}:waiters
// is marked ("deadline_ms ttl_msm channel") and its metadata is the field
// "m:<token>" beside it. The compat layout stores no metadata.
//
// Semaphores (default layout), with the same P and N, in N's slot:
//
//	P{N}:permits          sorted set: the holders' tokens, scored by their
//	                      expiry (the server's TIME, ms); expires no sooner
//	                      than its latest score
//	P{N}:permits:limit    string: the holders' limit; same expiry; deleted
//	                      with the last holder
//	P{N}:permits:fence    integer: the permits' fencing counter, as
//	                      P{N}:fence (persists)
//	P{N}:permits:released pub/sub channel: an empty message on every release
//
// Read/write locks (default layout), with the same P and N, in N's slot:
//
//	P{N}:rw:readers       sorted set: the readers' tokens, scored by expiry
//	P{N}:rw:writer        string: the writer's token, PX TTL
//	P{N}:rw:waits         sorted set: the waiting writers' wait ids, scored
//	                      by the deadline past which the wait keeps no reader
//	                      out; expires no sooner than its latest score
//	P{N}:rw:fence         integer: the writers' fencing counter (persists)
//	P{N}:rw:released      pub/sub channel: an empty message on a writer's or
//	                      a reader's release and when a writer stops waiting
//
// Each kind's keys end in a suffix of their own, with no "}" in it, so a
// lock, a semaphore and a read/write lock of the same name are three
// objects, and no name's keys of one kind equal another name's of another
// kind (those all end in "}" before the suffix).
//
// # Semaphores, read/write locks and elections
//
// In the default layout the driver declares Semaphore, PermitFencing,
// RWLock and Metadata; the compat layout declares none of them
// (Locker.Semaphore, RWLock and Elect then return an error matching
// errors.ErrUnsupported). Each operation is one Lua script on the slot's
// primary, so the guarantees are the lock's (see Guarantees): exact on one
// node, at the mercy of asynchronous replication in a failover.
//
// A permit is a member of the semaphore's sorted set, scored by its expiry
// on the server's clock. permit_acquire.lua drops expired members, refuses
// a limit other than the one stored beside the set (dlock.ErrLimitMismatch,
// naming both limits; nothing is taken), grants while fewer than the limit
// hold, and advances the permits' counter: Lease.Fence strictly increases
// with every permit grant of the semaphore (PermitFencing), as the lock's
// does, across a restart without persistence under the same clock
// assumption. Refresh re-scores the member only while it is live and never
// re-creates one; Release removes only its own token. A crashed holder's
// permit is dropped at its expiry by the next script that looks. The first
// holder's limit becomes the semaphore's; it is deleted with the last
// holder, so a new limit is accepted once nobody holds.
//
// A read/write lock is a sorted set of readers (as permits, without a
// limit), a writer key (as a lock's) and a sorted set of writers' waits.
// rw_acquire.lua grants a reader unless a writer holds or a writer's wait
// is registered and not past its deadline; it grants a writer unless
// another writer or any live reader holds, and then advances the writers'
// counter (Fencing covers the write side; readers have no token). A writer
// that waits (Lock) registers its wait in every attempt that finds the
// lock busy, with the deadline now + what blocks it + TTL, and renews it
// before then; the attempt that grants it removes it, and so does the
// release script run when it gives up, which also tells readers. So a
// waiting writer keeps new readers out while readers already holding keep
// the lock, and a writer that dies waiting stops keeping readers out at
// its wait's deadline.
//
// Waiting for a permit or either side of a read/write lock is notified,
// not queued: the waiter subscribes to the object's release channel (the
// Locker's one pub/sub connection, as for locks), and each release
// publishes there; every waiter then tries again, and the first attempts
// to reach the server win. There is no FIFO order among them (FIFO in
// Capabilities is about locks), a release wakes every waiter of the object,
// and a holder that expires without releasing publishes nothing: waiters
// look again at its expiry, as read in their last attempt. Why not a queue
// as for locks: a permit freed must go to one of possibly many waiters and
// a reader's grant to all readers waiting; the lock's hand-off scripts
// give one lock to one waiter, and a queue per kind would double that
// machinery for a plus the contract does not require. A waiter uses one
// token for all its attempts (an attempt whose reply was lost but which
// took a permit is renewed by the next, not counted twice) and, when it
// gives up, removes what that token holds and its writer's wait before
// Acquire returns (waiting up to 250ms for the server).
//
// Elections (Locker.Elect) are locks with the candidate as metadata:
// Metadata is stored in P{N}:meta only for a lease or waiter that has
// some, so a lock without metadata costs exactly what it did (no extra
// command in any script; the scripts take the key's name and skip it).
// Inspect reports the metadata, and Since, only when the key's token is
// the holder's, so a former holder's key that has not expired yet is never
// shown. A release by a holder with metadata publishes on the name's
// release channel, so Locker.Observe sees a resignation at once. The term
// (Lease.Fence, Leader.Term) is the lock's fencing token; a handoff from
// the queue carries the next candidate's metadata with it.
//
// Task queue (package queue, redis.NewQueue or queue.Open with a redis URL),
// with P the queue prefix (default "dlockq:") and Q the queue's name, every
// key in Q's slot: P{Q}:due, P{Q}:claimed and P{Q}:dead (sorted sets by due
// time, claim deadline and death time, in ms of the server's clock),
// P{Q}:payload and P{Q}:info (hashes by task id: the payload, and
// "<attempts>:<claim token>"), and the channel P{Q}:due:ready for wake-ups.
// See tasks_common.lua.
package redis
