// Package memqueue is the in-process backend of package
// [github.com/dlock/dlock/queue]: the reference every other backend is held
// to by package queue/conformance, and a queue for tests that need no
// server.
//
//	import _ "github.com/dlock/dlock/queue/memqueue"
//
//	c, err := queue.Open(ctx, "mem://tests")
//
// or [NewQueue](store, link) on a [memory.Store] of one's own.
//
// # URLs
//
//	mem://              the process-wide default store
//	mem://NAME          a process-wide store of that name
//
// A store (package [github.com/dlock/dlock/memory]) keeps its queues apart
// from its locks: a queue and a lock may have one name.
//
// # Guarantees
//
// Package queue's semantics within one process, with due times and claim
// deadlines kept to the millisecond, as a server keeps them. Tasks do not
// survive the process. A [memory.Link] between a Client and its store
// simulates network faults (partition, reset, latency) for tests.
//
// The backends' design is in [DESIGN.md].
//
// [DESIGN.md]: https://github.com/dlock/dlock/blob/main/queue/DESIGN.md
package memqueue
