package postgres_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5"
)

// The layout: a dlock lease holds the advisory lock hashtextextended(name, 0)
// on its own backend, visible in pg_locks; raw SQL on the same key is
// excluded by it and excludes it, both ways, with and without a key prefix.
func TestRawSQLInterop(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	for _, prefix := range []string{"", "app/"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			l := newLocker(t, srv.Addr(), &postgres.Options{KeyPrefix: prefix})
			name := uniqueName(t)
			key := prefix + name

			// dlock holds: raw SQL cannot take it.
			ls, err := l.TryAcquire(ctx, name, nil)
			if err != nil {
				t.Fatal(err)
			}
			pid := holderPID(t, raw, key)
			var rawPID int32
			if err := raw.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&rawPID); err != nil {
				t.Fatal(err)
			}
			if pid == rawPID {
				t.Fatal("the raw connection holds the lock")
			}
			// The operator's "who holds it" query of the package example.
			var who int32
			if err := raw.QueryRow(ctx, `
				SELECT l.pid
				FROM pg_locks l JOIN pg_stat_activity a USING (pid)
				WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
				  AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
				  AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid`, key).Scan(&who); err != nil || who != pid {
				t.Errorf("who-holds query = %d, %v; want %d", who, err, pid)
			}
			var ok bool
			if err := raw.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", key).Scan(&ok); err != nil || ok {
				t.Fatalf("raw pg_try_advisory_lock while dlock holds = %v, %v; want false", ok, err)
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			waitEntries(t, raw, key, time.Second)

			// Raw SQL holds: dlock cannot take it, and its waiter is granted
			// when raw SQL unlocks.
			if err := raw.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", key).Scan(&ok); err != nil || !ok {
				t.Fatalf("raw pg_try_advisory_lock after release = %v, %v; want true", ok, err)
			}
			if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("TryAcquire while raw SQL holds: got %v, want ErrNotAcquired", err)
			}
			w := acquireAsync(ctx, l, name, nil)
			waiting(t, raw, key, 1)
			// An operator sees the waiter's statement, tagged, in
			// pg_stat_activity (not the comments of acquire.sql).
			var query string
			if err := raw.QueryRow(ctx, `
				SELECT a.query FROM pg_locks l JOIN pg_stat_activity a USING (pid)
				WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1
				  AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
				  AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid`, key).Scan(&query); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(query, "/* dlock: acquire.sql */") || !strings.Contains(query, "pg_advisory_lock(") {
				t.Errorf("the waiter's pg_stat_activity.query is %q, want acquire.sql's statement, tagged", query)
			}
			if err := raw.QueryRow(ctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", key).Scan(&ok); err != nil || !ok {
				t.Fatalf("raw unlock = %v, %v", ok, err)
			}
			r := granted(t, w, 5*time.Second)
			if err := r.ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			waitEntries(t, raw, key, time.Second)
		})
	}
}

// psql, the operator's tool, interoperates with the documented expression
// both ways. It needs a psql binary (scripts/test.sh installs
// postgresql-client): without one the test fails when backends are required
// (DLOCK_REQUIRE_BACKENDS=1) and skips otherwise; TestRawSQLInterop runs the
// same statements over a raw connection either way.
func TestPsqlInterop(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("DLOCK_REQUIRE_BACKENDS") == "1" {
			t.Fatal("no psql on PATH (install postgresql-client; scripts/test.sh does)")
		}
		t.Skip("no psql on PATH")
	}
	raw := rawConn(t, srv.Addr())
	host, port, _ := strings.Cut(srv.Addr(), ":")
	run := func(ctx context.Context, sql string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, psql, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
			"-h", host, "-p", port, "-U", servers.PostgresUser, "-d", servers.PostgresDatabase, "-c", sql)
		cmd.Env = append(os.Environ(), "PGPASSWORD="+servers.PostgresPassword, "PGCONNECT_TIMEOUT=10")
		return cmd
	}
	l := newLocker(t, srv.Addr(), nil)
	name := uniqueName(t)
	quoted := "'" + strings.ReplaceAll(name, "'", "''") + "'"

	ls, err := l.TryAcquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(ctx, "SELECT pg_try_advisory_lock(hashtextextended("+quoted+", 0))").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "f" {
		t.Fatalf("psql pg_try_advisory_lock while dlock holds: %q, %v; want f", out, err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// psql takes the lock and keeps its session for a while; dlock waits for
	// the session to end.
	cmd := run(ctx, "SELECT pg_advisory_lock(hashtextextended("+quoted+", 0)); SELECT pg_sleep(1)")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	psqlPID := func() int32 {
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := lockEntries(ctx, raw, name)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 1 && strings.HasSuffix(got[0], "holds") {
				return holderPID(t, raw, name)
			}
			if time.Now().After(deadline) {
				t.Fatalf("psql did not take the lock: %v", got)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	if _, err := l.TryAcquire(ctx, name, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while psql (backend %d) holds: got %v, want ErrNotAcquired", psqlPID, err)
	}
	lb, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("Acquire behind psql: %v", err)
	}
	if pid := holderPID(t, raw, name); pid == psqlPID {
		t.Fatal("granted while psql's backend still holds the lock")
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("psql: %v", err)
	}
}

// Every pgx query execution mode works, the statement cache off (as behind a
// pooler) and the simple protocol included.
func TestQueryExecModes(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := poolConfig(t, srv.Addr())
			cfg.ConnConfig.DefaultQueryExecMode = mode
			l, err := postgres.NewFromConfig(ctx, cfg, &postgres.Options{KeyPrefix: "modes/"})
			if err != nil {
				t.Fatal(err)
			}
			closeAtCleanup(t, l)
			other := newLocker(t, srv.Addr(), &postgres.Options{KeyPrefix: "modes/"})
			name := uniqueName(t)
			for range 2 { // the second time on a used connection
				ls, err := l.TryAcquire(ctx, name, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := ls.Fence(); !ok {
					t.Error("no fence")
				}
				if ok, err := ls.Held(ctx); !ok || err != nil {
					t.Fatalf("Held = %v, %v", ok, err)
				}
				if err := ls.Refresh(ctx, 2*time.Second); err != nil {
					t.Fatal(err)
				}
				w := acquireAsync(ctx, other, name, nil)
				time.Sleep(10 * time.Millisecond)
				if err := ls.Release(ctx); err != nil {
					t.Fatal(err)
				}
				r := granted(t, w, 5*time.Second)
				lw, err := l.Acquire(ctx, name+"/wait", nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := lw.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if err := r.ls.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
