// Package memory is the in-process reference driver: a [Store] shared by any
// number of Lockers stands in for the lock server, so applications can test
// lock-using code without one, and driver authors can read the contract's
// reference implementation.
//
//	import _ "github.com/dlock/dlock/memory"
//
//	locker, err := dlock.Open(ctx, "mem://tests?ttl=1s")
//
// or [New](store, opts) on a Store of one's own ([NewStore]).
//
// # URLs
//
//	mem://              the process-wide default store
//	mem://NAME?ttl=10s  a process-wide store of that name
//
// Query parameters: the lock options of [dlock.Options] (ttl, refresh, …).
//
// # Guarantees
//
// Everything the contract asks, within one process: exclusive while valid,
// fencing tokens from one counter per Store (strictly increasing across all
// names), notified waiting. Locks do not survive the process. A [Link]
// between a Locker and its Store simulates network faults (partition, reset,
// latency) for tests.
//
// # Layout
//
// A map from lock name to {token, expiry, fence, metadata}; nothing outlives a
// released or expired lock but the Store's single fence counter, and the
// records of dlock.Once (a map of their own, until their retention).
package memory
