package mysql

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	gomysql "github.com/go-sql-driver/mysql"
)

const (
	// waitChunk is the longest a GET_LOCK waits on the server before the
	// driver asks again: the client's bound on a wait whose answer never
	// comes (a partition), as much as the server's.
	waitChunk = 30 * time.Second
	// waitGrace is how long past the server's own timeout the client waits
	// for GET_LOCK's answer.
	waitGrace = 5 * time.Second
	// waitRetryMin and waitRetryMax bound the backoff of a wait whose
	// connection or server failed, before it starts again.
	waitRetryMin = 10 * time.Millisecond
	waitRetryMax = time.Second
	// killTimeout bounds the end of a given-up wait's session (kill),
	// retries included.
	killTimeout = 5 * time.Second
	// killWait is how long Acquire waits for that end before it returns
	// and leaves the rest to the background: a release after the return
	// must not find the given-up wait still queued, and the lock go to a
	// session nobody reads.
	killWait = 250 * time.Millisecond
)

// Acquire waits for req.Name on the server (dlock/driver.Waiter): one
// attempt as TryAcquire makes it and, busy, GET_LOCK with a timeout on the
// same session, which the server ends when the holder releases the lock or
// its session ends; granted, the fencing token (or, without fencing, a
// check that the session holds the lock) follows in a request of its own,
// whose sending is the grant's Sent: the server counts the session's
// wait_timeout from the end of its last statement, which the wait's
// sending would place too early by the whole wait. While GET_LOCK runs,
// wait_timeout does not count (the session is not idle).
//
// ctx ends the wait: the client library then closes the connection, and
// the driver ends the session from another connection (kill; Acquire
// returns once it is done, or after killWait), since the server, busy in
// GET_LOCK, notices the close late (MariaDB 10.11 about a second later)
// or, when the close is lost on the way, only when the wait ends, and may
// meanwhile grant the lock to a session nobody reads. A wait whose
// connection or server failed starts again, on a new connection, until
// ctx ends.
func (d *driver) Acquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	secs, err := seconds(req.TTL)
	if err != nil {
		return nil, err
	}
	delay := waitRetryMin
	var timer *time.Timer
	for {
		g, err := d.wait(ctx, req, secs)
		if err == nil || ctx.Err() != nil || errors.Is(err, dlock.ErrInvalid) || errors.Is(err, dlock.ErrClosed) {
			return g, err
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w (after: %w)", dlock.ErrNotAcquired, ctx.Err(), err)
		case <-timer.C:
		}
		delay = min(2*delay, waitRetryMax)
	}
}

// wait is one try of Acquire, on one connection.
func (d *driver) wait(ctx context.Context, req dlockdriver.Request, secs int64) (*dlockdriver.Grant, error) {
	c, err := d.conn(ctx)
	if err != nil {
		return nil, err
	}
	key := LockName(d.prefix, req.Name)
	sent := time.Now()
	g, connID, err := d.try(ctx, c, key, secs, req.TTL)
	if err != nil {
		return nil, err
	}
	if g != nil {
		g.Sent = sent
		return g, nil
	}
	mark := newMark()
	for {
		if err := ctx.Err(); err != nil { // before the wait was sent
			d.putBack(c)
			return nil, fmt.Errorf("%w: %w", dlock.ErrNotAcquired, err)
		}
		left := waitChunk
		if end, ok := ctx.Deadline(); ok {
			left = min(left, time.Until(end))
		}
		wsecs := max(1, int64((left+time.Second-1)/time.Second))
		wctx, cancel := context.WithTimeout(ctx, time.Duration(wsecs)*time.Second+waitGrace)
		var got sql.NullInt64
		err := c.QueryRowContext(wctx, fill(waitSQL, "$KEY", literal(key), "$SECS", num(wsecs), "$MARK", mark)).Scan(&got)
		cancel()
		switch {
		case err != nil:
			discard(c)
			d.kill(connID, mark)
			return nil, fmt.Errorf("mysql: waiting in GET_LOCK: %w", err)
		case !got.Valid:
			discard(c)
			return nil, errors.New("mysql: GET_LOCK returned NULL (the wait was killed)")
		case got.Int64 == 1:
			return d.waited(ctx, c, key, connID, secs, req.TTL)
		}
		// The server's timeout: again.
	}
}

// waited completes a grant that GET_LOCK waited for: the fencing token, or
// without fencing a check that the session holds the lock, is the request
// whose sending is the grant's Sent (see Acquire).
func (d *driver) waited(ctx context.Context, c *sql.Conn, key string, connID, secs int64, ttl time.Duration) (*dlockdriver.Grant, error) {
	sent := time.Now()
	var fence uint64
	if d.fencing {
		var err error
		if fence, err = d.takeFence(ctx, c); err != nil {
			return nil, err
		}
	} else {
		var held sql.NullBool
		if err := c.QueryRowContext(ctx, fill(heldSQL, "$KEY", literal(key))).Scan(&held); err != nil || !held.Bool {
			discard(c)
			return nil, fmt.Errorf("mysql: checking the lock GET_LOCK granted (held %v): %w", held.Bool, err)
		}
	}
	g, err := d.granted(ctx, c, key, connID, fence, secs, ttl)
	if err != nil {
		return nil, err
	}
	g.Sent = sent
	return g, nil
}

// newMark is a random mark for a wait's statement (wait.sql).
func newMark() string {
	b := make([]byte, 8)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// kill ends the session id if it still runs the wait marked mark
// (kill.sql), retrying within killTimeout: its client gave the wait up and
// closed the connection, which the server, busy in GET_LOCK, notices late
// or not at all (see Acquire). It returns when the session has ended, or
// after killWait, leaving the rest to the background; Close waits for it.
func (d *driver) kill(id int64, mark string) {
	if id == 0 {
		return
	}
	stmts := strings.Split(fill(killSQL, "$ID", num(id), "$MARK", mark), ";\n")
	done := make(chan struct{})
	d.kills.Add(1)
	go func() {
		defer d.kills.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
		defer cancel()
		for delay := waitRetryMin; ; delay = min(2*delay, waitRetryMax) {
			if d.killOnce(ctx, stmts) == nil {
				return
			}
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return // the wait ends by its own timeout
			case <-t.C:
			}
		}
	}()
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// killOnce runs kill.sql's two statements on one connection.
func (d *driver) killOnce(ctx context.Context, stmts []string) error {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	var id int64
	switch err := c.QueryRowContext(ctx, stmts[0]).Scan(&id); {
	case errors.Is(err, sql.ErrNoRows):
		return nil // the wait is over
	case err != nil:
		return err
	}
	_, err = c.ExecContext(ctx, stmts[1])
	var me *gomysql.MySQLError
	if errors.As(err, &me) && me.Number == errUnknownThread {
		return nil // it ended meanwhile
	}
	return err
}

// errUnknownThread is the server's error for a KILL of a session that is
// gone (ER_NO_SUCH_THREAD).
const errUnknownThread = 1094
