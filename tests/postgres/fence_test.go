package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5"
)

// A crash can take back the sequence's last values (their WAL record had
// not reached the disk). The rewind below does that on purpose; the crash
// and restart that follow must still leave every later token above every
// earlier one: the first connection after a start moves the sequence
// postgres.EpochGap forward. Without that step the token after the restart
// would be below the earlier ones.
func TestFenceAfterCrashThatLostValues(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.RequireNew(t, servers.Postgres)
	l := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	var top uint64
	for range 5 {
		ls, err := l.TryAcquire(ctx, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		top = max(top, fence(t, ls))
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	raw := rawConn(t, srv.Addr())
	if _, err := raw.Exec(ctx, "SELECT setval('public.dlock_fence_seq', greatest($1::int8 - 1000, 1))", int64(top)); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(ctx, "CHECKPOINT"); err != nil { // the rewind survives the crash
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	var ls *dlock.Lease
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		ls, err = l.TryAcquire(ctx, name, nil)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryAcquire after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the server is starting up
	}
	defer func() { _ = ls.Release(ctx) }()
	if f := fence(t, ls); f <= top {
		t.Errorf("fence %d after the crash does not exceed %d from before", f, top)
	} else if f > top+postgres.EpochGap {
		t.Errorf("fence %d moved more than one EpochGap past %d", f, top)
	}
}

// A role that may not create the fencing objects is refused at
// NewFromConfig with an error naming postgres.DDL; once an administrator ran
// it (and granted the rights), the role fences.
func TestFenceObjectsByAdministrator(t *testing.T) {
	ctx := testCtx(t)
	addr := servers.Require(t, servers.Postgres).Addr()
	admin := rawConn(t, addr)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	schema, role := "fence_"+suffix, "fencer_"+suffix
	for _, s := range []string{
		"CREATE SCHEMA " + schema,
		"CREATE ROLE " + role + " LOGIN PASSWORD 'pw-" + suffix + "'",
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
	} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		_, _ = admin.Exec(ctx, "DROP ROLE "+role)
	})
	open := func() (*dlock.Locker, error) {
		cfg := poolConfig(t, addr)
		cfg.ConnConfig.User, cfg.ConnConfig.Password = role, "pw-"+suffix
		return postgres.NewFromConfig(ctx, cfg, &postgres.Options{FenceSchema: schema})
	}
	if l, err := open(); err == nil {
		_ = l.Close(ctx)
		t.Fatal("NewFromConfig succeeded for a role that cannot create the fencing objects")
	} else if !strings.Contains(err.Error(), "postgres.DDL") || strings.Contains(err.Error(), "pw-"+suffix) {
		t.Fatalf("the error should point at postgres.DDL and leave the password out: %v", err)
	}

	for _, s := range []string{
		postgres.DDL(schema),
		fmt.Sprintf("GRANT USAGE, UPDATE ON SEQUENCE %s TO %s", pgx.Identifier{schema, "dlock_fence_seq"}.Sanitize(), role),
		fmt.Sprintf("GRANT SELECT, INSERT ON TABLE %s TO %s", pgx.Identifier{schema, "dlock_fence_epoch"}.Sanitize(), role),
	} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	l, err := open()
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, l)
	ls, err := l.TryAcquire(ctx, uniqueName(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if f := fence(t, ls); f <= postgres.EpochGap {
		t.Errorf("fence %d: the sequence was not moved past the first epoch", f)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The URL form names the schema too.
	u, _ := url.Parse("postgres://h/db?fence_schema=" + schema)
	if _, opts, err := postgres.ParseURL(u); err != nil || opts.FenceSchema != schema {
		t.Errorf("fence_schema: %+v, %v", opts, err)
	}
}
