// Package driver is what a dlock backend implements: the interfaces a driver
// provides ([Driver], [Handle] and the optional [Waiter], [Notifier],
// [Abandoner], [LossNotifier], [Pinger]), the errors it returns, its URL
// registration ([Register]) and the URL toolkit every driver uses the same
// way ([Params], [TLS], [RejectUnknown], [RedactURL]).
//
// Applications do not use this package: they hold a
// *[github.com/dlock/dlock.Locker], built by dlock.Open from a URL or by a
// driver's New from a client they own. A driver implements backend
// primitives only; everything that is the same for every backend —
// validation, waiting, validity deadlines, the refresh watchdog, loss
// signalling, bookkeeping for Close — is done once by the Locker that
// dlock.New builds around a Driver.
//
// # Writing a driver
//
//  1. Implement [Driver] (and [Handle] for the leases it grants), plus the
//     optional interfaces the backend allows: [Waiter] when the server queues
//     waiters, [Notifier] when it can tell a waiter that a name may be free,
//     [Abandoner] when a lost reply can leave a lock behind, [LossNotifier]
//     when a Handle learns of a loss by callback.
//  2. Give applications New(client, *Options) returning *dlock.Locker
//     (through dlock.New), and ParseURL(*url.URL) returning the client's
//     config and the driver's Options.
//  3. Register an [OpenFunc] for the driver's URL schemes in init.
//  4. Pass the public suite, conformance.Run(t, harness), against a real
//     server, faults included (see package
//     [github.com/dlock/dlock/conformance], whose example is a complete toy
//     driver).
package driver
