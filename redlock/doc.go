// Package redlock is the dlock driver for Redlock: one lock over N
// independent Redis masters (N odd, at least 3), held while a majority of
// them hold it, built on github.com/redis/go-redis/v9.
//
//	import _ "github.com/dlock/dlock/redlock"
//
//	locker, err := dlock.Open(ctx, "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?ttl=10s")
//
// or, on the application's clients, one per master (any slice of go-redis
// clients; a Cluster or Ring node is refused):
//
//	locker, err := redlock.New([]*goredis.Client{c1, c2, c3}, nil)
//
// Guarantees in brief:
//   - Exclusive while a majority of independent masters keeps the lock and
//     clocks run at about the same rate (Redlock's timing assumptions).
//   - A minority of nodes down or paused changes nothing; with a majority
//     down acquisitions fail with ErrNoQuorum and leases end at ValidUntil.
//   - Fencing: per-node counters, the token written back to a majority
//     before the grant (nodes must keep their data, or restart late).
//   - Waiting: a release grants the lock to the first queued waiter (about
//     FIFO), without another request once a majority did; no split votes
//     among waiters.
//   - compat=true shares keys with go-redsync (no fencing).
//
// The sections below are the details.
//
// # URLs
//
//	redlock://[user:pass@]host1:port1,host2:port2,host3:port3[/db][?params]
//	redlocks://[user:pass@]host1:port1,…?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem
//
// Every node gets the same credentials, database and client settings. Give
// every host its port (6379 is assumed for a host without one, but Go's URL
// parser then rejects a list whose last host has none); IPv6 literals cannot
// be listed. Parameters:
//
//   - The lock options of dlock.Options: ttl, refresh, refresh_interval,
//     retry_min, retry_max, metadata (see dlock.OptionsFromQuery).
//   - prefix=app: sets Options.KeyPrefix; compat=true sets Options.Compat.
//   - node_timeout=50ms sets Options.NodeTimeout; drift=5ms sets
//     Options.Drift.
//   - redlocks only: tls_ca, tls_cert, tls_key, tls_server_name,
//     tls_insecure_skip_verify, as for the redis driver's rediss URLs.
//   - Everything go-redis's ParseURL accepts (dial_timeout, read_timeout,
//     pool_size, …), applied to every node.
//
// An ACL user needs, on every node, the scripting commands, the keys ~P*
// and, for notified waiting, the channels &P* (P the key prefix). Without
// rights on the channels, locks still work: releases do not announce
// themselves and waiters poll between RetryMin and RetryMax.
//
// Unknown parameters are rejected. Open pings every node, bounded by its ctx,
// and fails unless a majority answers, so that a service starts with a
// minority of nodes down; the Locker then owns the clients it made and
// closes them on Close.
//
// # Guarantees
//
// A lease is exclusive while it is valid (until its ValidUntil) as long as
// the nodes are independent masters (no replication between them), the
// clocks of the nodes and of the client advance at about the same rate (the
// drift margin, Options.Drift, covers the difference), and no node loses a
// lock before its TTL (see restarts below).
//
// Acquisition sends the same token to every node at once, each request
// bounded by the node timeout (Options.NodeTimeout). The lock is granted
// when a majority (N/2+1) took it and TTL − elapsed − drift > 0, elapsed
// counted from before the first request was sent; ValidUntil is that
// start + TTL − drift. A majority that came too late for that fails with
// dlock.ErrGrantExpired (not ErrNotAcquired: nobody else holds the lock),
// and its nodes are given back. The first majority to answer decides: a slow or
// paused minority does not delay an acquisition at all, and an acquisition
// that can no longer win stops at once, unless it leads a split vote. The
// nodes that took the lock for an attempt that failed give it back as soon
// as their answer arrives, so that no partial lock is left.
//
// Contention: waiters queue (see the waiting below), so that a release is
// handed to one of them; contenders that were not waiting and ask at once
// still split the vote (no one gets a majority), and if all gave up and
// retried, they would meet again. So a
// split vote has a leader: the contender that took the most nodes, the
// lowest token among those that took as many. A busy node answers with its
// holder's token, so every contender that heard from every node sees the
// same votes and picks the same leader. The others give their nodes back
// (silently) and wait, as behind a holder, for a release; the leader keeps
// its nodes and asks the nodes held by others again, half an attempt's
// time later and then backing off, for up to four times its first round's
// time (at most half the validity), until it holds a majority. A leader
// that gives up gives its nodes back and hands them to the next waiter;
// a contender that cannot tell the leader yet (nodes still to answer)
// waits for them; one that took no node never leads. Contenders whose views
// differed (a node answered one of them after another gave its node back)
// at worst lead both, which ends when one holds a majority or both give
// up, or lead neither, and look again after a few attempts' time. This
// changes nothing in what a grant needs: each node still takes the lock
// only when it is free, with SET NX and the full TTL, a lease is granted
// only once a majority holds its token, and its validity counts from
// before its first request, which every node's lock postdates (a leader's
// later requests only shorten its validity).
// Refresh extends the lock on every node that still holds the token
// (compare-and-pexpire), needs a majority, and moves ValidUntil to the
// refresh's start + TTL − drift; it never re-creates a lock a node has lost.
// The watchdog refreshes a Locker's leases that fall due together in
// batches: one script call per node for up to 256 leases, each lease judged
// by its own majority as alone (refresh_batch.lua).
// Release deletes the lock on every node that holds the token
// (compare-and-delete), waiting for each up to the node timeout; it never
// touches another holder's lock and is idempotent.
//
// Failures:
//
//   - A minority of nodes down, paused or partitioned away: everything
//     works. Acquire, Refresh and Held decide with the nodes that answer;
//     Release waits for the missing nodes up to the node timeout.
//   - A majority unreachable: TryAcquire fails with ErrNoQuorum (paused
//     nodes after the node timeout, nodes that refuse connections sooner)
//     and Acquire keeps
//     trying until its ctx ends. A held lease cannot be refreshed and ends,
//     with its loss signalled, at its ValidUntil.
//   - Process pauses (GC, SIGSTOP, a VM migration): a holder paused past
//     its ValidUntil may resume believing it holds a lock that expired and
//     was taken. The lease reports the loss, but only once the process runs
//     again.
//   - Clock jumps: Redis expires keys by its wall clock, so a node whose
//     clock is stepped forward drops locks early (a contender may then win
//     while the holder's lease is valid), and one stepped back keeps them
//     longer. ValidUntil is on the client's monotonic clock and does not
//     move. The drift margin covers clock rates, not steps: let NTP slew.
//   - Restart without persistence: a node that restarts at once has
//     forgotten its locks. If it was one of a holder's majority (a holder
//     that took fewer than all nodes), a contender can take a majority with
//     it while the holder's lease is still valid: two holders. The holder
//     learns of it only when a refresh reaches a majority that no longer
//     holds its token (the lease then ends with ErrLost); a refresh that
//     cannot reach a majority reports ErrNoQuorum and the lease lasts until
//     its ValidUntil. Two remedies: persistence (appendonly yes with
//     appendfsync always), or the delayed-restart rule: keep a node that
//     restarted without its data out of service for at least the longest
//     TTL in use, so that every lease it was part of has been refreshed
//     elsewhere or has expired before it can vote again.
//
// Fencing (default layout): every lease carries a token (Lease.Fence) that
// strictly increases with every grant of the name, across holders and
// takeovers. Each node keeps a counter per name, advanced in the same script
// that takes the lock there; the lease's token is the highest counter of the
// majority that granted it, and it is written back to (at least) a
// majority of nodes still holding the lock before the lease is granted.
// Any two majorities share a node, so a later holder counts past every
// earlier token. This needs the nodes not to lose their counters, or, for a
// node that lost one in a restart without persistence, the delayed-restart
// rule and node clocks that agree to within the TTL: a missing counter
// starts again at the node's clock in µs, above every token handed out
// before. The tokens are therefore large numbers (microseconds since 1970
// at the name's first use, counting up). Pass the token to the resource the
// lock protects and have it refuse writes carrying a lower token than the
// highest it has seen: that, not the lease alone, protects it from paused
// holders, clock jumps and restarts. The compat layout has no fencing.
//
// Waiting is queued, and a release hands the lock itself to the next
// waiter. A waiter subscribes, on every node, to its Locker's hand-off
// channel for the name, and waits until a majority confirmed; from then on,
// every attempt of its that finds the lock busy on a node also takes a
// ticket in the name's queue there, in the same script (scored by when the
// waiter began to wait, the same score on every node, so that the nodes
// agree on the order; a ticket keeps its place). A ticket names the
// waiter's Locker, its wait's hand-off token (random, 128 bits) and its
// TTL. The channel stays subscribed for 2s after its last waiter left, so a
// name waited on in a loop is subscribed already when the next wait begins:
// its first attempt then watches before it is sent and takes the ticket
// itself. A release, in the same script that deletes the lock on a node,
// grants it on that node to the first ticket whose Locker still listens
// (tickets of Lockers that do not, dead or gone, are dropped on the way):
// it advances the node's fencing counter as a grant does, sets the lock to
// the wait's hand-off token with the wait's TTL, removes the ticket, and
// publishes the token and the counter on that Locker's channel only. Once a
// majority handed it the lock, the waiter is granted without another
// request: its lease's token is the hand-off token, its fencing token the
// highest counter of those nodes (written back first to those behind, as
// for any grant, when they differ). So a contended grant costs a release
// and one pub/sub delivery, where a waiter woken to try cost its attempt's
// round trip too; and waiters are served about in the order they came,
// since the lock is never free between them for one that did not wait.
// When fewer than a majority handed it the lock within 10ms of the first,
// the waiter asks every node, and counts the nodes it finds handed to it as
// hand-offs (their messages may be late, or lost). A waiter handed some
// nodes and then nothing until its fallback (below) adopts them in its next
// attempt (takes them over as if it had taken them itself, and gives them
// back, handing them on, if it loses), and so does every later attempt of
// its wait: that ends a split of the nodes among waiters (tickets
// registered on some nodes only).
//
// Why a hand-off grant is safe: a node sets the lock to the hand-off token
// only after the ticket that carried it was registered there, that is
// after the wait's watch began (no request carries the ticket before), and
// it keeps the lock for the full TTL. Until the wait adopts or gives back a
// handed node (after which it no longer grants from what it was told, but
// asks the nodes), nothing but expiry takes the token off a node that
// handed it: every other script deletes or overwrites only its caller's own
// token, or a free lock. So the lease's validity counts from when the watch
// began: ValidUntil = that + TTL − drift, no later than the expiry of the
// lock on every handing node; when that leaves less than two thirds of the
// TTL, the lock is first refreshed on every node (a majority must still
// hold it) and the validity counts from the refresh. The hand-off advances
// the counter in the same script that grants, so the fencing argument
// below is unchanged: a hand-off is a grant on that node.
//
// A hand-off can go astray: it may reach a Locker whose wait has just left
// (the Locker then gives it back and hands it to the next ticket, see
// pass.lua; a wait that ends without a grant does the same on every node),
// the message or the ticket may be lost in a fault (a waiter whose
// connection failed is woken at once, and its attempt registers its ticket
// again, or finds the lock handed to it), or a waiter may not come. So a
// waiter not woken for 200ms to 400ms (at random) looks again anyway
// (registering its ticket again where it is missing), then after twice as
// long each time no hand-off came in between, up to 3.2s to 6.4s (so that
// waiters behind a lock held for long do not keep asking every node). A
// lock that expires without a release hands nothing: waiters look again
// when the holder's majority would have expired, as read at their last
// attempt, or at the fallback, whichever is first. A waiter that leaves
// removes its ticket (on a majority before its Acquire returns, on the rest
// in the background); a queue nobody registers in for a minute expires.
// Without a confirmed majority of subscriptions, waiters poll between
// RetryMin and RetryMax. A release with nobody queued publishes nothing
// (waiters of versions before 2026-11-25, which listened on P{N}:released
// without queueing, are no longer told: they look again when the holder's
// TTL has passed).
//
// A dead waiter costs nothing (its Locker no longer listens, so its ticket
// is skipped), but a waiter cut off from a node while that node still sees
// its subscription (a partition the node has not noticed yet) can be handed
// the lock there: the lock then sits idle on that node until the wait's TTL,
// and if that happens on a majority, nobody is granted the lock for up to a
// TTL (as with a holder that died). A handed node whose waiter is alive but
// did not get a majority is given back when its wait ends.
//
// An attempt cut short by its ctx returns at once; its requests finish in
// the background, and a lock they took is removed (announced) as soon as
// each answers. A request delayed in the network past its node timeout may
// still set the lock on that node later, where it lives until its TTL; on a
// minority of nodes that stops no one.
//
// # Layout
//
// Default layout, on every node, with P the key prefix (default "dlock:")
// and N the lock name:
//
//	P{N}            string: the lease token, with the TTL as its expiry
//	                (SET NX PX); deleted on release
//	P{N}:fence      integer: the node's fencing counter, started at the
//	                node's TIME in µs and INCRed with every grant on that
//	                node in the same script as the SET, and raised to a
//	                lease's fencing token before the lease is granted (see
//	                Guarantees); it persists by design, one small key per
//	                name ever locked
//	P{N}:waiters    sorted set: the waiters' tickets
//	                "<locker>:<wait>:<ttl>" (the Locker's random hex id, the
//	                wait's hand-off token, its TTL in ms), scored by when
//	                each began to wait (µs since 1970); expires a minute
//	                after the last registration
//	P{N}:released:<locker>
//	                pub/sub channel: "<wait>:<counter>" for the wait of that
//	                Locker a release hands the lock to (the lock key then
//	                holds <wait>)
//
// Compat layout (Options.Compat, URL compat=true), with P defaulting to "":
//
//	PN              string: the lease token, SET NX PX, compare-and-delete
//	PN:waiters, PN:released:<locker>
//	                the waiters' queue and channels, as above (counter 0)
//
// The compat layout is github.com/go-redsync/redsync/v4's (a redsync.Mutex
// named PN over the same nodes), so that dlock and redsync locks on the same
// name exclude each other and a team can move from one to the other without
// stopping every process at once. There is no fencing counter in it. In
// the default layout a redsync mutex named "dlock:{N}" excludes dlock's N.
// redsync does not publish when it releases: a dlock waiter behind a redsync
// lock retries when the holder's remaining TTL has passed.
//
// Lock metadata (Options.Metadata) is not stored.
//
// # Semaphores, read/write locks and elections
//
// Not offered: Capabilities declares Semaphore, RWLock and Metadata false,
// so Locker.Semaphore, Locker.RWLock and Locker.Elect return an error
// matching errors.ErrUnsupported. Use the redis driver (one master, or a
// Redis Cluster) for them.
//
// Semaphores: Redlock's safety argument is quorum intersection: any two
// majorities of the N nodes share a node, and one node never holds two
// tokens of a lock at once, so two leases cannot both be valid. A semaphore
// of limit k counted the same way (a permit granted when a majority of
// nodes each admitted it among at most k holders) has no such argument: two
// majorities still share a node, but k+1 majorities need not share one
// node among all of them. With N = 3 and k = 2, permits P1 on nodes {A, B},
// P2 on {B, C} and P3 on {A, C} each hold a majority while every node holds
// only 2: three valid permits of limit 2. In general a grant quorum of q
// nodes bounds the valid permits only by floor(k·N/q), which is k only
// when q > k·N/(k+1): with majorities (q = N/2+1) up to about 2k permits
// can be valid at once, and a sound quorum tends to all N nodes as k grows,
// so one node down would stop every grant, which is what Redlock is there to
// avoid. A sound semaphore over independent masters needs more than Redlock
// gives (a consensus on the holder set, or a grant from every node), so
// this driver offers none rather than one that can exceed its limit.
//
// Read/write locks: their exclusion would follow from quorum intersection
// (a writer's majority and a reader's share a node, which refuses the
// second), and a writer's wait registered on a majority would keep out
// readers, who need a majority without it. But this driver's split-vote,
// hand-off and fence write-back machinery is built for exclusive locks and
// has not been extended to a readers' set per node; it declares no RWLock
// rather than an untested one.
//
// Elections need Metadata, and Locker.Leader needs Inspect to name the
// leader's term: Inspect here cannot report the holder's fencing token
// (each node's counter also counts the grants of attempts that lost the
// vote, so no node's counter is the holder's), and the metadata is not
// stored, so Leader could name neither the candidate nor the term.
package redlock
