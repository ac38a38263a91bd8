package main

import (
	"net"
	"net/url"
	"strings"

	"github.com/dlock/dlock/cmd/dlock/bench"
	"github.com/dlock/dlock/dlocktest"

	// The drivers the bench can open by URL.
	_ "github.com/dlock/dlock/etcd"
	_ "github.com/dlock/dlock/memory"
	_ "github.com/dlock/dlock/mysql"
	_ "github.com/dlock/dlock/postgres"
	_ "github.com/dlock/dlock/redis"
	_ "github.com/dlock/dlock/redlock"
	_ "github.com/dlock/dlock/zookeeper"
)

// backend is one row of the bench's backend table. Adding a backend is adding
// a row: the servers it needs, how its URL is made from their addresses, and
// its raw-client floor.
type backend struct {
	// name is the backend's name in -backends and -url.
	name string
	// servers are started (one each, in order) unless -url gives the URL;
	// none for an in-process backend.
	servers []dlocktest.Kind
	// url is the driver URL for the started servers' addresses (127.0.0.1:port).
	url func(addrs []string) string
	// floor opens raw clients for the same backend as the driver URL.
	floor func(u *url.URL) (bench.FloorOpener, error)
	// peers are the other libraries' locks on the same backend (-peers);
	// nil for none.
	peers func(u *url.URL) ([]bench.Peer, error)
}

// backends is the table, in the order the bench runs and reports them.
var backends = []backend{
	{
		name: "memory",
		url:  func([]string) string { return "mem://dlock-bench" },
		// A mutex-map in this process, as the memory driver is.
		floor: func(*url.URL) (bench.FloorOpener, error) { return bench.MemoryFloors(), nil },
	},
	{
		name:    "redis",
		servers: []dlocktest.Kind{dlocktest.Redis},
		url: func(addrs []string) string {
			return (&url.URL{Scheme: "redis", Host: addrs[0], Path: "/0"}).String()
		},
		floor: bench.RedisFloors,
		peers: bench.RedisPeers,
	},
	{
		name:    "redlock",
		servers: []dlocktest.Kind{dlocktest.Redis, dlocktest.Redis, dlocktest.Redis, dlocktest.Redis, dlocktest.Redis},
		url: func(addrs []string) string {
			return (&url.URL{Scheme: "redlock", Host: strings.Join(addrs, ","), Path: "/0"}).String()
		},
		floor: bench.RedlockFloors,
		peers: bench.RedlockPeers,
	},
	{
		name:    "etcd",
		servers: []dlocktest.Kind{dlocktest.Etcd},
		url: func(addrs []string) string {
			return (&url.URL{Scheme: "etcd", Host: addrs[0]}).String()
		},
		floor: bench.EtcdFloors,
		peers: bench.EtcdPeers,
	},
	{
		name:    "zookeeper",
		servers: []dlocktest.Kind{dlocktest.ZooKeeper},
		url: func(addrs []string) string {
			return (&url.URL{Scheme: "zk", Host: addrs[0], Path: "/dlock-bench"}).String()
		},
		floor: bench.ZooKeeperFloors,
		peers: bench.ZooKeeperPeers,
	},
	{
		name:    "postgres",
		servers: []dlocktest.Kind{dlocktest.Postgres},
		url: func(addrs []string) string {
			return (&url.URL{
				Scheme:   "postgres",
				User:     url.UserPassword(dlocktest.PostgresUser, dlocktest.PostgresPassword),
				Host:     addrs[0],
				Path:     "/" + dlocktest.PostgresDatabase,
				RawQuery: "sslmode=disable",
			}).String()
		},
		floor: bench.PostgresFloors,
		peers: bench.PostgresPeers,
	},
	{
		name:    "mysql",
		servers: []dlocktest.Kind{dlocktest.MariaDB},
		url: func(addrs []string) string {
			return (&url.URL{
				Scheme: "mysql",
				User:   url.UserPassword(dlocktest.MariaDBUser, dlocktest.MariaDBPassword),
				Host:   addrs[0],
				Path:   "/" + dlocktest.MariaDBDatabase,
			}).String()
		},
		floor: bench.MySQLFloors,
		peers: bench.MySQLPeers,
	},
}

func lookupBackend(name string) (backend, bool) {
	for _, b := range backends {
		if b.name == name {
			return b, true
		}
	}
	return backend{}, false
}

func backendNames() []string {
	names := make([]string, len(backends))
	for i, b := range backends {
		names[i] = b.name
	}
	return names
}

// loopback reports whether addr is 127.0.0.1:port: the bench only ever
// starts servers there.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && host == "127.0.0.1"
}
