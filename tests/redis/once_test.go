package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/redis"
	"github.com/dlock/dlock/tests/internal/testutil"
)

// Once's records follow Redis's persistence (the driver does not declare
// DurableRecords): with AOF fsynced on every write, a completed slot stays
// done across a crash and restart of the server; without persistence the
// restart forgets it, and the slot runs again.
func TestOnceRecordAcrossRestart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     *dlocktest.StartOptions
		survives bool
	}{
		{"aof", &dlocktest.StartOptions{Cmd: []string{"--appendonly", "yes", "--appendfsync", "always"}}, true},
		{"no persistence", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testutil.Ctx(t)
			srv := dlocktest.RequireNewWith(t, dlocktest.Redis, tc.opts)
			p := "dlocktest:" + testutil.RandomHex(4) + ":"
			a := newLocker(t, newClient(t, srv.Addr()), &redis.Options{KeyPrefix: p})
			ran := 0
			fn := func(context.Context, *dlock.Lease) error { ran++; return nil }
			if err := a.Once(ctx, "report", "s1", nil, fn); err != nil {
				t.Fatalf("Once before the restart: %v", err)
			}
			if err := srv.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			b := newLocker(t, newClient(t, srv.Addr()), &redis.Options{KeyPrefix: p})
			var err error
			for range 20 { // the first commands after the restart may find old connections
				if err = b.Once(ctx, "report", "s1", nil, fn); err == nil || errors.Is(err, dlock.ErrAlreadyDone) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			switch {
			case tc.survives && !errors.Is(err, dlock.ErrAlreadyDone):
				t.Errorf("Once after a restart with AOF: %v (fn ran %d times); want ErrAlreadyDone", err, ran)
			case !tc.survives && (err != nil || ran != 2):
				t.Errorf("Once after a restart without persistence: %v (fn ran %d times); want nil, the slot run again", err, ran)
			}
		})
	}
}
