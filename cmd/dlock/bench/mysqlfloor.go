package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/dlock/dlock/mysql"
	gomysql "github.com/go-sql-driver/mysql"
)

// MySQLFloors returns an opener of raw MySQL/MariaDB floors for the server
// of a mysql:// URL: each Floor is one database/sql connection of its own
// (a *sql.Conn of a pool of one), made from the client configuration the
// mysql driver's ParseURL gives for the URL (TLS included).
//
// TryLock is `SELECT GET_LOCK(?, 0)` on the Floor's pinned connection and
// Unlock `SELECT RELEASE_LOCK(?)`: session user locks, the primitive the
// driver builds on, with no expiry (the TTL is not applied: the driver
// sets wait_timeout in the same request as its GET_LOCK), no fencing and
// no token (a
// session's lock is its own). Names go through mysql.LockName, as the
// driver's do: the server takes at most 64 characters.
func MySQLFloors(u *url.URL) (FloorOpener, error) {
	cfg, err := mysqlConfig(u, "floor")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (Floor, error) {
		f, err := openMySQLFloor(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: mysql floor: %w", err)
		}
		return f, nil
	}, nil
}

// mysqlConfig is the client configuration for a mysql:// URL, as the
// driver parses it; what names the floor or peer in errors.
func mysqlConfig(u *url.URL, what string) (*gomysql.Config, error) {
	if u == nil || u.Scheme != "mysql" {
		return nil, fmt.Errorf("bench: the mysql %s needs a mysql:// URL", what)
	}
	cfg, _, err := mysql.ParseURL(u)
	if err != nil {
		return nil, err // dlock.ErrInvalid, without the password
	}
	return cfg, nil
}

// openMySQLFloor dials one connection and pins it.
func openMySQLFloor(ctx context.Context, cfg *gomysql.Config) (*mysqlFloor, error) {
	conn, err := gomysql.NewConnector(cfg.Clone())
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	c, err := db.Conn(ctx)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &mysqlFloor{db: db, c: c}, nil
}

type mysqlFloor struct {
	db *sql.DB
	c  *sql.Conn // the session: its locks are the client's
}

// TryLock and Unlock do not give their statement the caller's ctx
// (floorStatementTimeout bounds it): go-sql-driver closes the connection,
// and with it the session and its locks, when a ctx ends mid-statement, and
// the runner ends ctxs at the end of every round; neither statement ever
// waits on the server.
func (f *mysqlFloor) TryLock(ctx context.Context, name, _ string, _ time.Duration) (bool, error) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), floorStatementTimeout)
	defer cancel()
	var got sql.NullInt64
	if err := f.c.QueryRowContext(qctx, "SELECT GET_LOCK(?, 0)", mysql.LockName("", name)).Scan(&got); err != nil {
		return false, err
	}
	if !got.Valid {
		return false, errors.New("GET_LOCK returned NULL")
	}
	return got.Int64 == 1, nil
}

func (f *mysqlFloor) Unlock(ctx context.Context, name, _ string) error {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), floorStatementTimeout)
	defer cancel()
	var released sql.NullInt64
	return f.c.QueryRowContext(qctx, "SELECT RELEASE_LOCK(?)", mysql.LockName("", name)).Scan(&released)
}

// Close closes the connection, ending the session (and its locks).
func (f *mysqlFloor) Close() error {
	return errors.Join(f.c.Close(), f.db.Close())
}
