package redlock_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redlock"
	goredis "github.com/redis/go-redis/v9"
)

// A node that is a cluster or ring client spreads keys over several servers,
// so it is not one Redlock node: New refuses it with ErrInvalid before any
// I/O (the addresses are closed ports).
func TestNewRefusesClusterAndRing(t *testing.T) {
	single := func(i int) goredis.UniversalClient {
		return goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:" + strconv.Itoa(1+i), ContextTimeoutEnabled: true})
	}
	tests := []struct {
		name string
		odd  func() goredis.UniversalClient
		want string
	}{
		{"cluster", func() goredis.UniversalClient {
			return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:4"}, ContextTimeoutEnabled: true})
		}, "ClusterClient"},
		{"ring", func() goredis.UniversalClient {
			return goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:4"}, ContextTimeoutEnabled: true})
		}, "Ring"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for pos := range 3 {
				clients := []goredis.UniversalClient{single(0), single(1), single(2)}
				clients[pos].Close()
				clients[pos] = tt.odd()
				l, err := redlock.New(clients, nil)
				for _, c := range clients {
					_ = c.Close()
				}
				if err == nil {
					_ = l.Close(t.Context())
					t.Fatalf("node %d a %s: got a Locker, want ErrInvalid", pos, tt.name)
				}
				if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("node %d a %s: got %v, want ErrInvalid naming %s", pos, tt.name, err, tt.want)
				}
			}
		})
	}
}
