package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/fence/redisfence"
)

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestRedisSetRefusesLower proves that Set keeps the value of the highest
// fence: equal and higher fences write, a lower one is refused with the
// stored fence, and fences past 2^53 compare exactly.
func TestRedisSetRefusesLower(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rdb := goredis.NewClient(&goredis.Options{Addr: dlocktest.Require(t, dlocktest.Redis).Addr()})
	defer rdb.Close()
	key := unique(t)
	if _, _, err := redisfence.Get(ctx, rdb, key); !errors.Is(err, goredis.Nil) {
		t.Errorf("Get of a missing key: got %v, want goredis.Nil", err)
	}
	const big = 1<<53 + 1
	for _, w := range []struct {
		value string
		token uint64
		stale bool
	}{
		{"a", 9, false}, {"b", 9, false}, {"c", 10, false}, {"d", 2, true},
		{"e", big, false}, {"f", big - 1, true}, {"g", big + 1, false},
	} {
		err := redisfence.Set(ctx, rdb, key, w.value, w.token)
		if got := errors.Is(err, fence.ErrStale); got != w.stale || (!w.stale && err != nil) {
			t.Errorf("Set(%q, fence %d): got %v, want stale %v", w.value, w.token, err, w.stale)
		}
	}
	if v, f, err := redisfence.Get(ctx, rdb, key); err != nil || v != "g" || f != big+1 {
		t.Errorf("Get = %q, %d, %v; want %q, %d", v, f, err, "g", uint64(big+1))
	}
	err := redisfence.Set(ctx, rdb, key, "h", 1)
	var stale *fence.StaleError
	if !errors.As(err, &stale) || stale.Highest != big+1 {
		t.Errorf("a stale Set: got %v, want a StaleError naming fence %d", err, uint64(big+1))
	}
	if err := redisfence.Set(ctx, rdb, "", "x", 1); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("empty key: got %v, want ErrInvalid", err)
	}
}
