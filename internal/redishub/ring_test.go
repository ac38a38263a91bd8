package redishub

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// A *redis.Ring (whose Subscribe panics without a channel) gets an error
// from Watch, not a panic. No server is needed: the Ring is refused before
// any I/O.
func TestWatchRingFails(t *testing.T) {
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	h := New(ring, "redis", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var (
		x   *Watcher
		err error
	)
	func() {
		defer func() {
			if r := recover(); r != nil {
				// The hub's lock is still held: leave it unclosed.
				t.Fatalf("Watch on a Ring panicked: %v", r)
			}
		}()
		x, err = h.Watch(ctx, "c", "", func(string, bool) {})
	}()
	defer h.Close()
	if err == nil {
		x.Stop()
		t.Fatal("Watch on a Ring: got no error, want one")
	}
}
