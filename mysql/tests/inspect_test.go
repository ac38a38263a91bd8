package tests_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
)

// Inspect names the session holding a lock by the connection id
// IS_USED_LOCK gives (with its user), whether a lease of this Locker, of
// another Locker or a raw GET_LOCK holds it; the fence only for a lease of
// the inspecting Locker; a free name is not held.
func TestInspect(t *testing.T) {
	addr := dlocktest.Require(t, dlocktest.MariaDB).Addr()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	raw := rawDB(t, addr)
	open := func() *dlock.Locker {
		l, err := dlock.Open(ctx, url(addr, "prefix=inspect/"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	l, other := open(), open()
	name := "jobs-" + t.Name()
	holderOf := func() int64 {
		t.Helper()
		var id sql.NullInt64
		if err := raw.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", "inspect/"+name).Scan(&id); err != nil || !id.Valid {
			t.Fatalf("IS_USED_LOCK = %v, %v; want the holder's connection", id, err)
		}
		return id.Int64
	}

	info, err := l.Inspect(ctx, name)
	if err != nil || info.Held || info.Name != name {
		t.Fatalf("free name: Inspect = %+v, %v; want not held", info, err)
	}

	ls, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	fence, _ := ls.Fence()
	want := fmt.Sprintf("connection %d (%s@", holderOf(), dlocktest.MariaDBUser)
	info, err = l.Inspect(ctx, name)
	if err != nil || !info.Held || !strings.HasPrefix(info.Holder, want) || !info.HasFence || info.Fence != fence {
		t.Errorf("own lease: Inspect = %+v, %v; want held by %q… with fence %d", info, err, want, fence)
	}
	info, err = other.Inspect(ctx, name)
	if err != nil || !info.Held || !strings.HasPrefix(info.Holder, want) || info.HasFence {
		t.Errorf("another Locker's lease: Inspect = %+v, %v; want held by %q…, fence unknown", info, err, want)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := l.Inspect(ctx, name); err != nil || info.Held {
		t.Errorf("after release: Inspect = %+v, %v; want not held", info, err)
	}

	// A raw client's GET_LOCK on the same server name.
	c, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got int
	if err := c.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", "inspect/"+name).Scan(&got); err != nil || got != 1 {
		t.Fatalf("raw GET_LOCK = %d, %v", got, err)
	}
	want = fmt.Sprintf("connection %d (", holderOf())
	if info, err := l.Inspect(ctx, name); err != nil || !info.Held || !strings.HasPrefix(info.Holder, want) || info.HasFence {
		t.Errorf("raw holder: Inspect = %+v, %v; want held by %q…, fence unknown", info, err, want)
	}
}
