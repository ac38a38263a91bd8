// Package dlocktest runs throwaway backend servers (Redis, etcd, ZooKeeper,
// PostgreSQL, MariaDB) in Docker, through github.com/ory/dockertest/v3, for tests and
// benchmarks of dlock and of third-party drivers, and breaks them on purpose:
// pause, kill, start again.
//
// A driver's conformance test with server faults is a conformance.Harness
// that embeds a *[Server], whose PauseServer, ResumeServer and RestartServer
// methods implement conformance.ServerFaults (dlock's package conformance):
//
//	type harness struct{ *dlocktest.Server }
//
//	func (h harness) NewLocker(t testing.TB, d *dlock.Options) (*dlock.Locker, conformance.Faults) {
//		p := faultnet.ListenT(t, h.Addr()) // this locker's own faultable path
//		return newLocker(t, p.Addr(), d), p // the driver's client, dialling p
//	}
//	func (h harness) Residue(ctx context.Context, name string) ([]string, error) { … }
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, harness{dlocktest.RequireNew(t, dlocktest.Redis)})
//	}
//
// and a TestMain that calls [Main] (or [CloseAll]). The package's
// example_test.go does it with the redis driver.
//
// # Images
//
// Each kind is built from a small Dockerfile on debian:bookworm-slim embedded
// in this package (images/<kind>/Dockerfile), tagged dlock-<kind>:<short hash
// of its build context>, so that a build happens once per machine and again
// only when the Dockerfile changes. Nothing is pulled: the base image must be
// present (dlock's scripts/docker-setup.sh makes it when no registry answers).
// [Start] builds a missing image on first use, one build at a time;
// [BuildImages] (or `go run github.com/dlock/dlock/dlocktest/cmd/buildimages`)
// builds them side by side beforehand, as a CI job's first step.
//
// A third-party driver's backend is a kind of its own: [Register] an
// [Image] (its Dockerfile, port and health check) from the driver's test
// module, and Start, Require and the fault methods serve it like the
// kinds in [Kinds]:
//
//	//go:embed image
//	var image embed.FS
//
//	func TestMain(m *testing.M) {
//		ctx, _ := fs.Sub(image, "image")
//		if err := dlocktest.Register(dlocktest.Image{Kind: "mydb", Context: ctx, Port: 4000, Ping: pingMyDB}); err != nil {
//			log.Fatal(err)
//		}
//		dlocktest.Main(m)
//	}
//
// # Containers
//
// A container is named dlock-test-<kind>-<random>, labelled with [LabelKind]
// and [LabelOwner], and publishes its port on 127.0.0.1 only, at a host port
// chosen once, so that [Server.Addr] stays the same across [Server.Stop] and
// [Server.Start]. Containers are not auto-removed, which would delete them
// on the first kill; [Server.Close] and [CloseAll] remove them, and a process
// that died without doing so has its containers and networks removed by the
// next process on the same host that starts one.
//
// # Faults
//
// [Server.Pause] freezes the server's processes, [Server.Stop] kills them
// with SIGKILL as a crash would, [Server.Start] and [Server.Restart] bring
// the server back at the same address. A transient engine failure (such as
// "OCI runtime pause failed: unable to freeze" on a loaded machine) is
// retried a few times; a fault that still cannot be injected is an error
// wrapping [ErrFault]: the harness's failure, not the backend's or the
// driver's.
//
// # External servers
//
// When DLOCK_REDIS_ADDR, DLOCK_ETCD_ADDR, DLOCK_ZOOKEEPER_ADDR,
// DLOCK_POSTGRES_ADDR or DLOCK_MARIADB_ADDR is set to a host:port, [Start] returns a [Server] for
// that address instead of starting a container, and its fault methods return
// [ErrNotControllable]. Tests write, delete and flush data freely: point these
// variables only at throwaway servers. An external PostgreSQL must accept
// [PostgresUser] with [PostgresPassword], an external MariaDB [MariaDBUser]
// with [MariaDBPassword] on [MariaDBDatabase].
//
// # Tests
//
// Tests use [Require] (a server shared by the whole test binary) or
// [RequireNew] (a dedicated one, for tests that pause or kill it), and call
// [Main] or [CloseAll] from TestMain. Without Docker those helpers skip the
// test, unless DLOCK_REQUIRE_BACKENDS=1 makes them fail. The package does not
// import package testing ([TB] is its own), so a command may link it.
package dlocktest
