package dlocktest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRedisCluster proves that the shared cluster forms with every slot
// served and every node announced on 127.0.0.1, and that Require gives it
// again.
func TestRedisCluster(t *testing.T) {
	c := RequireRedisCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	info, err := redisCommand(ctx, c.Addrs()[0], "CLUSTER", "INFO")
	if err != nil {
		t.Fatal(err)
	}
	if s := info.(string); !strings.Contains(s, "cluster_slots_ok:16384") || !strings.Contains(s, "cluster_known_nodes:3") {
		t.Errorf("CLUSTER INFO: %s", s)
	}
	if again := RequireRedisCluster(t); again != c {
		t.Errorf("second RequireRedisCluster made a new cluster")
	}
}

// TestRedisSentinel proves that the sentinel monitors the master, hands out
// its container address, which PublishedAddr maps to its published port,
// and fails over to the replica when asked.
func TestRedisSentinel(t *testing.T) {
	rs := RequireRedisSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	master := func() string {
		t.Helper()
		r, err := redisCommand(ctx, rs.Sentinel.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
		if err != nil {
			t.Fatal(err)
		}
		hp := r.([]any)
		return rs.PublishedAddr(hp[0].(string) + ":" + hp[1].(string))
	}
	if got := master(); got != rs.Master.Addr() {
		t.Fatalf("master: got %s, want %s", got, rs.Master.Addr())
	}
	if _, err := redisCommand(ctx, rs.Sentinel.Addr(), "SENTINEL", "FAILOVER", MasterName); err != nil {
		t.Fatal(err)
	}
	err := poll(ctx, func() error {
		if got := master(); got != rs.Replica.Addr() {
			return fmt.Errorf("master after failover: got %s, want the replica %s", got, rs.Replica.Addr())
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
