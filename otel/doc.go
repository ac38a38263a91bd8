// Package dlockotel reports what happens to a [dlock.Locker]'s leases to
// OpenTelemetry: metrics of acquisitions, holds, losses and refresh
// failures, and a span per acquisition and release. It is a module of its
// own, so that applications that do not use OpenTelemetry do not depend on
// it.
//
//	hook, err := dlockotel.Hook(&dlockotel.Options{Backend: "redis"})
//	if err != nil { ... }
//	locker.SetObserver(dlock.Observer{Hook: hook})
//
// # Metrics
//
// Every instrument carries dlock.backend ([Options].Backend) and, with
// [Options].WithName, dlock.lock (the lock name: one series per name, so only
// for a bounded set of names).
//
//	dlock.acquire.duration  histogram, s: every Acquire and TryAcquire, with
//	                        dlock.outcome = acquired | not_acquired | error
//	dlock.acquire.wait      histogram, s: the acquisitions that were granted
//	dlock.lease.hold        histogram, s: how long leases were held, with
//	                        dlock.outcome = released | lost
//	dlock.leases.held       up-down counter: leases held now
//	dlock.lease.losses      counter: leases lost
//	dlock.refresh.failures  counter: watchdog refreshes that failed (and
//	                        were retried)
//
// # Traces
//
// A span "dlock.acquire" per acquisition and "dlock.release" per release,
// children of the span in the caller's ctx, with the lock name and fence as
// attributes and an error status when they fail; a loss is recorded as a
// span "dlock.lost" of its own (it happens on the watchdog's goroutine,
// outside any caller's trace).
package dlockotel
