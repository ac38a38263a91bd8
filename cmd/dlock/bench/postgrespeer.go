package bench

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgWaitBound bounds a pg_advisory_lock statement the postgres peer left
// waiting when its ctx ended: past it pgx closes the connection.
const pgWaitBound = time.Minute

// PostgresPeers returns the peer on the server of a postgres:// or
// postgresql:// URL: session advisory locks taken the way applications take
// them through pgx with no lock library, TryLock with pg_try_advisory_lock
// and Lock with pg_advisory_lock, which waits in the server's lock queue.
// Each client is one pgx connection made as the postgres floor makes them
// (PostgresFloors); the TTL is not applied (advisory locks have none).
//
// pgx ends a statement whose ctx ends by closing the connection (and so the
// session and its locks), or with a cancel request and a pause of 100ms:
// either would weigh on the figures at the end of every round. So Lock runs
// its statement in a goroutine and returns when ctx ends, leaving the
// statement to give the lock back when granted, and the client's next
// statement waits for it.
func PostgresPeers(u *url.URL) ([]Peer, error) {
	cfg, err := postgresConfig(u, "peer")
	if err != nil {
		return nil, err
	}
	return []Peer{{
		Name: "pg_advisory_lock", Module: "github.com/jackc/pgx/v5",
		About: "one pgx connection per client; TryLock is SELECT pg_try_advisory_lock, Lock is SELECT pg_advisory_lock (waits in the server's queue), Unlock is SELECT pg_advisory_unlock",
		Open: func(ctx context.Context) (Floor, error) {
			c, err := pgx.ConnectConfig(ctx, cfg.Copy())
			if err != nil {
				return nil, fmt.Errorf("bench: postgres peer: %w", err)
			}
			return &postgresPeer{postgresFloor: postgresFloor{c: c}}, nil
		},
	}}, nil
}

// postgresPeer is the floor (pg_try_advisory_lock, pg_advisory_unlock) with
// a waiting Lock.
type postgresPeer struct {
	postgresFloor
	bg detached
}

func (p *postgresPeer) TryLock(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	p.bg.idle()
	return p.postgresFloor.TryLock(ctx, name, token, ttl)
}

func (p *postgresPeer) Lock(ctx context.Context, name, _ string, _ time.Duration) error {
	p.bg.idle()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pgWaitBound)
	lock := func() error {
		defer cancel()
		_, err := p.c.Exec(qctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", name)
		return err
	}
	return p.bg.wait(ctx, lock, func() { _ = p.postgresFloor.Unlock(ctx, name, "") })
}

func (p *postgresPeer) Unlock(ctx context.Context, name, token string) error {
	p.bg.idle()
	return p.postgresFloor.Unlock(ctx, name, token)
}

// Close waits for a statement left waiting, then closes the connection
// (ending the session, which releases its locks).
func (p *postgresPeer) Close() error {
	p.bg.idle()
	p.bg.close()
	return p.postgresFloor.Close()
}
