package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/mysql"
)

// MySQLPeers returns the peer on the server of a mysql:// URL: session user
// locks taken the way applications take them through database/sql with no
// lock library, TryLock with GET_LOCK(name, 0) and Lock with GET_LOCK(name,
// 60), which waits on the server and is woken by the holder's release. Each
// client is one pinned connection made as the mysql floor makes them
// (MySQLFloors); the TTL is not applied (user locks have none).
//
// go-sql-driver ends a statement whose ctx ends by closing the connection
// (and so the session and its locks), which would weigh on the figures at
// the end of every round. So Lock runs its statement in a goroutine and
// returns when ctx ends, leaving the statement to give the lock back when
// granted, and the client's next statement waits for it.
func MySQLPeers(u *url.URL) ([]Peer, error) {
	cfg, err := mysqlConfig(u, "peer")
	if err != nil {
		return nil, err
	}
	return []Peer{{
		Name: "GET_LOCK (database/sql)", Module: "github.com/go-sql-driver/mysql",
		About: "one database/sql connection per client; TryLock is SELECT GET_LOCK(name, 0), Lock is SELECT GET_LOCK(name, 60) (waits on the server), Unlock is SELECT RELEASE_LOCK",
		Open: func(ctx context.Context) (Floor, error) {
			f, err := openMySQLFloor(ctx, cfg)
			if err != nil {
				return nil, fmt.Errorf("bench: mysql peer: %w", err)
			}
			return &mysqlPeer{mysqlFloor: f}, nil
		},
	}}, nil
}

// mysqlWaitBound is how long a GET_LOCK of the mysql peer waits on the
// server, in seconds; a wait left behind when its ctx ended ends by then.
const mysqlWaitBound = 60

// mysqlPeer is the floor (GET_LOCK(name, 0), RELEASE_LOCK) with a waiting
// Lock.
type mysqlPeer struct {
	*mysqlFloor
	bg detached
}

func (p *mysqlPeer) TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	p.bg.idle()
	return p.mysqlFloor.TryLock(ctx, name, token, ttl)
}

func (p *mysqlPeer) Lock(ctx context.Context, name, _ string, _ time.Duration) error {
	p.bg.idle()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), (mysqlWaitBound+10)*time.Second)
	lock := func() error {
		defer cancel()
		var got sql.NullInt64
		if err := p.c.QueryRowContext(qctx, "SELECT GET_LOCK(?, ?)", mysql.LockName("", name), mysqlWaitBound).Scan(&got); err != nil {
			return err
		}
		if !got.Valid || got.Int64 != 1 {
			return fmt.Errorf("%w: GET_LOCK waited %ds", dlock.ErrNotAcquired, mysqlWaitBound)
		}
		return nil
	}
	return p.bg.wait(ctx, lock, func() { _ = p.mysqlFloor.Unlock(ctx, name, "") })
}

func (p *mysqlPeer) Unlock(ctx context.Context, name, token string) error {
	p.bg.idle()
	return p.mysqlFloor.Unlock(ctx, name, token)
}

// Close waits for a statement left waiting, then closes the connection
// (ending the session, which releases its locks).
func (p *mysqlPeer) Close() error {
	p.bg.idle()
	p.bg.close()
	return p.mysqlFloor.Close()
}
