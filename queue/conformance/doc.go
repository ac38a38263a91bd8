// Package conformance is the public test suite of task-queue drivers
// (package [github.com/dlock/dlock/queue]): every driver, the project's own
// or a third party's, runs it against a real server with [Run] and a
// [Harness] that gives it clients whose connections it can black-hole and
// reset.
//
//	func TestQueueConformance(t *testing.T) { conformance.Run(t, harness{...}) }
//
// Each property is a subtest with a one-line comment saying what it proves
// (see tests.go); each uses queues of its own and fails, rather than hangs,
// past its deadline. Liveness bounds scale with DLOCK_TOLERANCE_SCALE, as
// the lock suite's do; safety checks never do.
package conformance
