package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock/dlock/dlocktest"
)

// `dlock bench -peers` on real servers measures every peer of the backend
// in every scenario beside dlock and the floor, and prints the backend's
// peersSmall is small with 200ms rounds: each throughput scenario must
// complete an acquisition per worker in every round, and on a loaded
// machine a peer's first blocking Lock of a round can wait behind the
// statement its last round left waiting (50ms rounds had none, once, for
// pg_advisory_lock beside two busy loops), or take a round's length by
// itself (100ms rounds had none for etcd's concurrency.Mutex, independent,
// at load ~12 in busy run 31).
var peersSmall = append(append([]string(nil), small...), "-duration", "400ms")

// side-by-side table.
func TestBenchPeers(t *testing.T) {
	tests := []struct {
		backend string
		url     func(t *testing.T) string
		peers   []string
	}{
		{"redis", func(t *testing.T) string {
			return "redis://" + dlocktest.Require(t, dlocktest.Redis).Addr() + "/0"
		}, []string{"redsync", "redislock"}},
		{"redlock", func(t *testing.T) string {
			// Three nodes: the shared server and two of the test's own.
			addrs := []string{dlocktest.Require(t, dlocktest.Redis).Addr()}
			for range 2 {
				addrs = append(addrs, dlocktest.RequireNew(t, dlocktest.Redis).Addr())
			}
			return "redlock://" + strings.Join(addrs, ",") + "/0"
		}, []string{"redsync"}},
		{"etcd", func(t *testing.T) string {
			return "etcd://" + dlocktest.Require(t, dlocktest.Etcd).Addr()
		}, []string{"concurrency.Mutex"}},
		{"zookeeper", func(t *testing.T) string {
			return "zk://" + dlocktest.Require(t, dlocktest.ZooKeeper).Addr() + "/dlock-bench-test"
		}, []string{"zk.Lock"}},
		{"postgres", func(t *testing.T) string {
			return "postgres://" + dlocktest.PostgresUser + ":" + dlocktest.PostgresPassword + "@" +
				dlocktest.Require(t, dlocktest.Postgres).Addr() + "/" + dlocktest.PostgresDatabase + "?sslmode=disable"
		}, []string{"pg_advisory_lock"}},
		{"mysql", func(t *testing.T) string {
			return "mysql://" + dlocktest.MariaDBUser + ":" + dlocktest.MariaDBPassword + "@" +
				dlocktest.Require(t, dlocktest.MariaDB).Addr() + "/" + dlocktest.MariaDBDatabase
		}, []string{"GET_LOCK (database/sql)"}},
	}
	for _, tt := range tests {
		t.Run(tt.backend, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "report.json")
			args := append([]string{"bench", "-backends", tt.backend, "-url", tt.backend + "=" + tt.url(t), "-peers", "-q", "-o", out}, peersSmall...)
			code, stdout, stderr := runCmd(t, args...)
			if code != 0 {
				t.Fatalf("status %d; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			for _, want := range append([]string{"dlock beside other libraries", "dlock × best peer speed"}, tt.peers...) {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout)
				}
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			type scenarios struct {
				Client, Version string
				Uncontended     *struct{ N int }
				Handoff         *struct{ N int }
				Contended       *struct{ Ops, Overlaps int64 }
				Independent     *struct{ Ops int64 }
				Errors          []string
			}
			var rep struct {
				Backends []struct {
					Peers   []scenarios
					VsPeers map[string]struct{ Peer string } `json:"vs_peers"`
				}
			}
			if err := json.Unmarshal(b, &rep); err != nil {
				t.Fatalf("report is not JSON: %v", err)
			}
			if len(rep.Backends) != 1 || len(rep.Backends[0].Peers) != len(tt.peers) {
				t.Fatalf("report = %+v, want one backend with peers %v", rep, tt.peers)
			}
			for i, p := range rep.Backends[0].Peers {
				if p.Client != tt.peers[i] || p.Version == "" || p.Uncontended == nil || p.Handoff == nil ||
					p.Contended == nil || p.Contended.Ops <= 0 || p.Contended.Overlaps != 0 || p.Independent == nil || p.Independent.Ops <= 0 {
					t.Errorf("peer %d = %+v (contended %+v, independent %+v), want %s measured in every scenario", i, p, p.Contended, p.Independent, tt.peers[i])
				}
			}
			if vs := rep.Backends[0].VsPeers; len(vs) != 4 {
				t.Errorf("vs_peers = %+v, want the four scenarios", vs)
			}
		})
	}
}
