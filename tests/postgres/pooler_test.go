package postgres_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
	"github.com/dlock/dlock/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// txPooler is a minimal transaction pooler, as PgBouncer in
// pool_mode=transaction is: every client connection is served by two real
// server connections of its own, and each transaction (everything up to a
// ReadyForQuery that says idle) goes to the other one than the last. It
// authenticates clients without a password, and announces either the first
// server connection's backend key (pid) or a made-up one, as PgBouncer does.
type txPooler struct {
	t       testing.TB
	target  string // the server's URL
	fakeKey bool
	ln      net.Listener
	wg      sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
}

func newTxPooler(t testing.TB, addr string, fakeKey bool) *txPooler {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &txPooler{t: t, target: dsn(addr), fakeKey: fakeKey, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(p.close)
	return p
}

func (p *txPooler) Addr() string { return p.ln.Addr().String() }

func (p *txPooler) close() {
	p.ln.Close()
	p.mu.Lock()
	p.done = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers a connection to close with the pooler; false if closed.
func (p *txPooler) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *txPooler) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.track(c) {
			p.wg.Go(func() { p.session(c) })
		}
	}
}

func (p *txPooler) session(client net.Conn) {
	defer client.Close()
	be := pgproto3.NewBackend(client, client)
	msg, err := be.ReceiveStartupMessage()
	if _, ok := msg.(*pgproto3.SSLRequest); ok && err == nil {
		if _, err := client.Write([]byte("N")); err != nil {
			return
		}
		msg, err = be.ReceiveStartupMessage()
	}
	if _, ok := msg.(*pgproto3.StartupMessage); !ok || err != nil {
		return // a cancel request, or garbage: not served
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var backends [2]*pgconn.HijackedConn
	for i := range backends {
		pc, err := pgconn.Connect(ctx, p.target)
		if err != nil {
			p.t.Errorf("txPooler: connecting to the server: %v", err)
			return
		}
		if err := pc.SyncConn(ctx); err != nil {
			p.t.Errorf("txPooler: %v", err)
			return
		}
		hc, err := pc.Hijack()
		if err != nil {
			p.t.Errorf("txPooler: %v", err)
			return
		}
		defer hc.Conn.Close()
		if !p.track(hc.Conn) {
			return
		}
		backends[i] = hc
	}
	be.Send(&pgproto3.AuthenticationOk{})
	for k, v := range backends[0].ParameterStatuses {
		be.Send(&pgproto3.ParameterStatus{Name: k, Value: v})
	}
	key := &pgproto3.BackendKeyData{ProcessID: backends[0].PID, SecretKey: backends[0].SecretKey}
	if p.fakeKey {
		key = &pgproto3.BackendKeyData{ProcessID: 4242424, SecretKey: []byte{1, 2, 3, 4}}
	}
	be.Send(key)
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if be.Flush() != nil {
		return
	}
	cur := 0
	for {
		m, err := be.Receive()
		if err != nil {
			return
		}
		if _, ok := m.(*pgproto3.Terminate); ok {
			return
		}
		fe := backends[cur].Frontend
		fe.Send(m)
		switch m.(type) {
		case *pgproto3.Sync, *pgproto3.Query:
		default:
			continue // the server answers at the Sync
		}
		if fe.Flush() != nil {
			return
		}
		for {
			r, err := fe.Receive()
			if err != nil {
				return
			}
			be.Send(r)
			if rfq, ok := r.(*pgproto3.ReadyForQuery); ok {
				if be.Flush() != nil {
					return
				}
				if rfq.TxStatus == 'I' {
					cur = 1 - cur // the transaction is over: the next one goes elsewhere
				}
				break
			}
		}
	}
}

// pooledLocker is a Locker whose connections go through a pooler at addr.
// The statement cache is off, as it must be behind a transaction pooler.
func pooledLocker(t testing.TB, addr string, opts *postgres.Options) *dlock.Locker {
	t.Helper()
	cfg := poolConfig(t, addr)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := postgres.NewFromConfig(ctx, cfg, opts)
	if err != nil {
		t.Fatalf("NewFromConfig through the pooler: %v", err)
	}
	closeAtCleanup(t, l)
	return l
}

// Behind a pooler that announces a backend key of its own (as PgBouncer
// does), every acquisition is refused with ErrPooler before any lock is
// taken, and a waiting Acquire does not retry.
func TestPoolerRefused(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	p := newTxPooler(t, srv.Addr(), true)
	l := pooledLocker(t, p.Addr(), nil)
	name := uniqueName(t)
	_, err := l.TryAcquire(ctx, name, nil)
	if !errors.Is(err, postgres.ErrPooler) || !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire through a transaction pooler: got %v, want ErrPooler and ErrNotAcquired", err)
	}
	t.Log(err)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := l.Acquire(wctx, name, nil); !errors.Is(err, postgres.ErrPooler) || wctx.Err() != nil {
		t.Fatalf("Acquire through a transaction pooler: got %v, want ErrPooler at once", err)
	}
	waitEntries(t, raw, name, time.Second)
}

// With SessionPooler set (the user claims a session pooler) but a
// transaction pooler in fact, the acquisition works on one backend and the
// lease's next statement runs on another: the pid check finds it, the lease
// is lost with ErrPooler, and the lock is gone from the server (its client
// connection, and so its session, is closed).
func TestPoolerFoundMidLease(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	for _, op := range []string{"Held", "Refresh", "Release"} {
		t.Run(op, func(t *testing.T) {
			p := newTxPooler(t, srv.Addr(), false)
			l := pooledLocker(t, p.Addr(), &postgres.Options{SessionPooler: true})
			name := uniqueName(t)
			ls, err := l.TryAcquire(ctx, name, nil)
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			holderPID(t, raw, name)
			switch op {
			case "Held":
				_, err = ls.Held(ctx)
			case "Refresh":
				err = ls.Refresh(ctx, 0)
			case "Release":
				err = ls.Release(ctx)
			}
			if !errors.Is(err, postgres.ErrPooler) {
				t.Fatalf("%s on another backend: got %v, want ErrPooler", op, err)
			}
			lostWithin(t, ls, time.Second)
			t.Log(ls.Err())
			waitEntries(t, raw, name, 2*time.Second)
		})
	}
}

// Without SessionPooler, a pooler that passes the first backend's key through
// is still found out: whichever backend a statement lands on, the lock is
// either refused at once or lost at the lease's next statement.
func TestPoolerPassingKeyThrough(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.Require(t, servers.Postgres)
	raw := rawConn(t, srv.Addr())
	p := newTxPooler(t, srv.Addr(), false)
	l := pooledLocker(t, p.Addr(), nil)
	refused, found := 0, 0
	for range 4 {
		name := uniqueName(t)
		ls, err := l.TryAcquire(ctx, name, nil)
		if err != nil {
			if !errors.Is(err, postgres.ErrPooler) {
				t.Fatalf("TryAcquire: got %v, want success or ErrPooler", err)
			}
			refused++
			continue
		}
		if err := ls.Refresh(ctx, 0); !errors.Is(err, postgres.ErrPooler) {
			t.Fatalf("Refresh on another backend: got %v, want ErrPooler", err)
		}
		found++
		waitEntries(t, raw, name, 2*time.Second)
	}
	t.Logf("%d refused at acquisition, %d found at the next statement", refused, found)
}
