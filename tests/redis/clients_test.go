package redis_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redis"
	goredis "github.com/redis/go-redis/v9"
)

// New refuses, with ErrInvalid and before any I/O, the clients it cannot
// use correctly: a Ring (client-side sharding moves locks between shards),
// a client that ignores ctx deadlines, and typed nils. The addresses are
// closed ports: nothing is dialled.
func TestNewRefusesClients(t *testing.T) {
	tests := []struct {
		name   string
		client func() goredis.UniversalClient
		want   string // in the error
	}{
		{"ring", func() goredis.UniversalClient {
			return goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true})
		}, "Ring"},
		{"client without ContextTimeoutEnabled", func() goredis.UniversalClient {
			return goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
		}, "ContextTimeoutEnabled"},
		{"cluster client without ContextTimeoutEnabled", func() goredis.UniversalClient {
			return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
		}, "ContextTimeoutEnabled"},
		{"failover client without ContextTimeoutEnabled", func() goredis.UniversalClient {
			return goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}})
		}, "ContextTimeoutEnabled"},
		{"nil *Client", func() goredis.UniversalClient { return (*goredis.Client)(nil) }, "nil client"},
		{"nil *ClusterClient", func() goredis.UniversalClient { return (*goredis.ClusterClient)(nil) }, "nil client"},
		{"nil", func() goredis.UniversalClient { return nil }, "nil client"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.client()
			if c != nil {
				if closer, ok := c.(interface{ Close() error }); ok && !isNilClient(c) {
					defer closer.Close()
				}
			}
			for _, compat := range []bool{false, true} {
				l, err := redis.New(c, &redis.Options{Compat: compat})
				if err == nil {
					_ = l.Close(t.Context())
					t.Fatalf("New (compat %v): got a Locker, want ErrInvalid", compat)
				}
				if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("New (compat %v): got %v, want ErrInvalid mentioning %q", compat, err, tt.want)
				}
			}
		})
	}
}

func isNilClient(c goredis.UniversalClient) bool {
	switch c := c.(type) {
	case *goredis.Client:
		return c == nil
	case *goredis.ClusterClient:
		return c == nil
	}
	return false
}
