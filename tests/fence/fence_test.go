// Tests of the fence guards against real servers: a frozen holder's write
// refused by each store, and PostgreSQL's check holding concurrent writers
// of a resource until the transaction that checked first ends.
package fence_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/fence/pgfence"
	"github.com/dlock/dlock/fence/redisfence"
	_ "github.com/dlock/dlock/postgres"
	_ "github.com/dlock/dlock/redis"
)

const childEnv = "DLOCK_FENCE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	dlocktest.Main(m)
}

func pgDSN(addr string) string {
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", dlocktest.PostgresUser, dlocktest.PostgresPassword, addr, dlocktest.PostgresDatabase)
}

func unique(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
}

// stores are the guarded stores a writer uses: a Redis key through
// redisfence and a PostgreSQL row whose transaction checks pgfence.
type stores struct {
	rdb      *goredis.Client
	pg       *pgx.Conn
	guard    *pgfence.Guard
	resource string
}

func openStores(ctx context.Context, redisAddr, pgAddr, resource string) (*stores, error) {
	pg, err := pgx.Connect(ctx, pgDSN(pgAddr))
	if err != nil {
		return nil, err
	}
	g, err := pgfence.New("")
	if err != nil {
		return nil, err
	}
	s := &stores{rdb: goredis.NewClient(&goredis.Options{Addr: redisAddr}), pg: pg, guard: g, resource: resource}
	if err := g.CreateTable(ctx, pg); err != nil {
		s.close()
		return nil, err
	}
	if _, err := pg.Exec(ctx, `CREATE TABLE IF NOT EXISTS fence_reports (resource text PRIMARY KEY, body text NOT NULL)`); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *stores) close() {
	_ = s.rdb.Close()
	_ = s.pg.Close(context.Background())
}

// writeRedis writes body to the resource's Redis key under token.
func (s *stores) writeRedis(ctx context.Context, body string, token uint64) error {
	return redisfence.Set(ctx, s.rdb, s.resource, body, token)
}

// writePG writes body to the resource's row in a transaction that checks
// token first.
func (s *stores) writePG(ctx context.Context, body string, token uint64) error {
	return pgx.BeginFunc(ctx, s.pg, func(tx pgx.Tx) error {
		if err := s.guard.Check(ctx, tx, s.resource, token); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO fence_reports VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET body = EXCLUDED.body`, s.resource, body)
		return err
	})
}

// child is the frozen holder: it takes the lock, says its fence, and after a
// line on stdin (sent once it has been stopped and continued) writes to
// both stores and says what each answered. Its environment names the
// servers and the lock.
func child() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := os.Getenv(childEnv)
	s, err := openStores(ctx, os.Getenv("FENCE_REDIS"), os.Getenv("FENCE_PG"), name)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer s.close()
	l, err := dlock.Open(ctx, "redis://"+os.Getenv("FENCE_REDIS"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer l.Close(context.Background())
	ls, err := l.Acquire(ctx, name, &dlock.Options{TTL: time.Second})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	token, err := fence.Token(ls)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("fence", token)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Println("error", err)
		return 1
	}
	// Write at once, as a process waking from a pause does, whatever the
	// lease's watchdog is about to find.
	fmt.Println("redis", errString(s.writeRedis(ctx, "child", token)))
	fmt.Println("pg", errString(s.writePG(ctx, "child", token)))
	return 0
}

func errString(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, fence.ErrStale):
		return "stale"
	default:
		return strconv.Quote(err.Error())
	}
}

// TestFrozenHolderRefused freezes a holder's process (SIGSTOP) while it holds
// a Redis lock, lets the lock pass to this process, which writes to both
// guarded stores, then thaws the holder and has it write at once: both
// stores refuse it, and keep this process's values.
func TestFrozenHolderRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	redisAddr := dlocktest.Require(t, dlocktest.Redis).Addr()
	pgAddr := dlocktest.Require(t, dlocktest.Postgres).Addr()
	name := unique(t)

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+name, "FENCE_REDIS="+redisAddr, "FENCE_PG="+pgAddr)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = stdin.Close()
		_ = cmd.Wait()
	}()
	out := bufio.NewScanner(stdout)
	line := func() string {
		if !out.Scan() {
			t.Fatalf("the child ended early: %v", out.Err())
		}
		return out.Text()
	}
	var childToken uint64
	if l := line(); !strings.HasPrefix(l, "fence ") {
		t.Fatalf("child: %s", l)
	} else if childToken, err = strconv.ParseUint(strings.TrimPrefix(l, "fence "), 10, 64); err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	l, err := dlock.Open(ctx, "redis://"+redisAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	ls, err := l.Acquire(ctx, name, nil) // granted once the frozen holder's TTL has run out
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(context.Background())
	token, err := fence.Token(ls)
	if err != nil {
		t.Fatal(err)
	}
	if token <= childToken {
		t.Fatalf("fence %d after the frozen holder's %d; want it higher", token, childToken)
	}
	s, err := openStores(ctx, redisAddr, pgAddr, name)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if err := s.writeRedis(ctx, "parent", token); err != nil {
		t.Fatalf("the new holder's Redis write: %v", err)
	}
	if err := s.writePG(ctx, "parent", token); err != nil {
		t.Fatalf("the new holder's PostgreSQL write: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintln(stdin, "write"); err != nil {
		t.Fatal(err)
	}
	for _, store := range []string{"redis", "pg"} {
		if got, want := line(), store+" stale"; got != want {
			t.Errorf("the thawed holder's write: got %q, want %q", got, want)
		}
	}
	if v, f, err := redisfence.Get(ctx, s.rdb, name); err != nil || v != "parent" || f != token {
		t.Errorf("Redis holds %q at fence %d (err %v); want %q at %d", v, f, err, "parent", token)
	}
	var body string
	if err := s.pg.QueryRow(ctx, `SELECT body FROM fence_reports WHERE resource = $1`, name).Scan(&body); err != nil || body != "parent" {
		t.Errorf("PostgreSQL holds %q (err %v), want %q", body, err, "parent")
	}
	if h, ok, err := s.guard.Highest(ctx, s.pg, name); err != nil || !ok || h != token {
		t.Errorf("guard table: fence %d, %v, %v; want %d", h, ok, err, token)
	}
}
