// Package conformance is the public test suite every dlock driver must pass,
// the project's own and third parties' alike, against a real backend.
//
// A driver hooks in with a small [Harness] in its _test.go:
//
//	func TestConformance(t *testing.T) { conformance.Run(t, harness{...}) }
//
// The harness makes independent Lockers on one backend, as separate
// processes would have, each with its own fault-injectable network path (see
// package [github.com/dlock/dlock/conformance/faultnet]), so that the suite
// can partition, reset or slow one locker's traffic while the others carry
// on.
//
// Each property is a named subtest with a deadline and lock names of its
// own; a subtest whose capability the driver does not declare is skipped,
// naming it. [Benchmark] gives comparable benchmark figures on the same
// harness.
//
// # Timing
//
// Safety bounds are strict: nobody is granted a lock before the previous
// holder's ValidUntil, and ValidUntil is counted from when the request was
// sent. Liveness bounds (how late a loss signal, a grant or a return may
// come) are generous enough for a loaded 2-core machine running every
// driver's suite at once, and the environment variable
// DLOCK_TOLERANCE_SCALE ([ToleranceScaleEnv]; a positive number, default 1)
// multiplies them all for slower machines; it never loosens a safety bound.
// Lockers are warmed up (one acquire and release) before they are timed, and
// a failure message states the bound it used.
//
// # Chaos
//
// The last subtest, Chaos, runs several lockers on one name under a seeded
// random mix of faults for [Config].Chaos (20s by default, more with
// DLOCK_CHAOS_DURATION), and checks exclusion, fencing and recovery after
// the faults heal. A harness that may also pause and restart the backend
// implements [ServerFaults]; the seed of a failed run is logged, and
// DLOCK_CHAOS_SEED replays its schedule.
package conformance
