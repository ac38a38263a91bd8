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
package driver
