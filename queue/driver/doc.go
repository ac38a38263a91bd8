// Package driver is what a task-queue backend implements for package
// [github.com/dlock/dlock/queue]: the atomic primitives of one queue service
// ([Driver]), its errors, and its URL registration ([Register]). Applications
// use package queue; a driver implements primitives only, and everything
// that is the same for every backend — validation, waiting, claims' validity
// — is done once by [github.com/dlock/dlock/queue.Client].
//
// Every method is atomic on the server: it takes effect whole or not at all,
// so that an error leaves every task where it was or where the call put it.
// "Now" and "due" are the server's clock, so that clients whose clocks
// disagree still never see a task early.
//
// # Rounding
//
// Servers keep due times and claim deadlines to the millisecond, and the
// clients count a claim's Until, and a delay, from a moment before they
// sent the request. So every rounding goes the safe way: a deadline or
// due time a driver sets is the server's now rounded up to the
// millisecond plus the duration rounded up (Millis, UpMilli), and "has it
// passed?" compares it with the server's now unrounded or rounded down.
// A claim then never ends on the server before the client's Until, and a
// delayed task is never due before its enqueue's send time + Delay. A task
// due after no delay is due at the server's now rounded down: due at once
// (no take can precede the call that made it due).
package driver
