package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// stmt is one of the statements of an acquisition or a release, which run
// on pgconn directly: prepared once per connection under a name of the
// driver's own, then executed with binary parameters and results decoded by
// hand. That skips pgx's per-query work (the statement cache lookup,
// encoding and scan plans, a Rows per query), which costs more client CPU
// than the driver's own bookkeeping; contended, where every holder's CPU
// delays the next grant, it is worth about a tenth of the throughput.
type stmt struct {
	name                  string // "dlock_" and a hash of sql: Lockers of other settings on one pool do not collide
	sql                   string
	params, results       []uint32 // the type OIDs the statement must have
	paramFmts, resultFmts []int16  // their formats: text for text, binary otherwise
}

// namedStmts is the key, in a connection's CustomData, of whether its
// statements may be prepared under a name (see stmt.run).
const namedStmts = "dlock/postgres.named"

// The types the statements use, by OID.
const (
	oidBool   = 16
	oidInt8   = 20
	oidInt4   = 23
	oidText   = 25
	oidFloat8 = 701
)

func newStmt(sql string, params, results []uint32) *stmt {
	h := fnv.New64a()
	h.Write([]byte(sql))
	formats := func(oids []uint32) []int16 {
		f := make([]int16, len(oids))
		for i, oid := range oids {
			if oid != oidText {
				f[i] = 1 // binary
			}
		}
		return f
	}
	return &stmt{
		name: fmt.Sprintf("dlock_%016x", h.Sum64()), sql: sql,
		params: params, results: results, paramFmts: formats(params), resultFmts: formats(results),
	}
}

// prepare prepares s on pg and checks the types the server gave its
// parameters and columns.
func (s *stmt) prepare(ctx context.Context, pg *pgconn.PgConn) (*pgconn.StatementDescription, error) {
	sd, err := pg.Prepare(ctx, s.name, s.sql, s.params) // typed: a variant may leave a parameter unused
	if err != nil {
		return nil, err
	}
	ok := slices.Equal(sd.ParamOIDs, s.params) && len(sd.Fields) == len(s.results)
	for i := 0; ok && i < len(sd.Fields); i++ {
		ok = sd.Fields[i].DataTypeOID == s.results[i]
	}
	if !ok {
		return nil, fmt.Errorf("postgres: statement %s: the server typed its parameters and columns unexpectedly", s.name)
	}
	return sd, nil
}

// errNoRow reports a statement that returned no row (it always returns one).
var errNoRow = errors.New("postgres: the statement returned no row")

// run executes s on c with params and hands the values of its one row to
// row, before reading the rest of the result. With pgx's default
// QueryExecModeCacheStatement, a connection that has not prepared s yet does
// so first, and one whose prepared statements were dropped (DISCARD ALL,
// DEALLOCATE) prepares it again. Any other mode says that the connection
// may not keep prepared statements (a pooler between it and the server): s
// then goes unnamed, parsed with every execution, in one round trip.
func (s *stmt) run(ctx context.Context, c *pgx.Conn, params [][]byte, row rowDecoder) error {
	pg := c.PgConn()
	data := pg.CustomData()
	named, ok := data[namedStmts].(bool)
	if !ok {
		named = c.Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement // a copy of the config: once per connection
		data[namedStmts] = named
	}
	if !named {
		return s.read(pg.ExecParams(ctx, s.sql, params, s.params, s.paramFmts, s.resultFmts), row)
	}
	for retried := false; ; retried = true {
		sd, _ := data[s.name].(*pgconn.StatementDescription)
		if sd == nil {
			var err error
			if sd, err = s.prepare(ctx, pg); err != nil {
				return err
			}
			data[s.name] = sd
		}
		// With the description prepare returned, no Describe goes with
		// every execution (and no row description comes back).
		err := s.read(pg.ExecStatement(ctx, sd, params, s.paramFmts, s.resultFmts), row)
		if err != nil && !retried && isCode(err, "26000") { // invalid_sql_statement_name
			delete(data, s.name)
			continue
		}
		return err
	}
}

func isCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// rowDecoder takes the values of a statement's one row, which are valid
// during the call only.
type rowDecoder interface {
	decode(v [][]byte) error
}

// read reads the result of one execution of s.
func (s *stmt) read(rr *pgconn.ResultReader, row rowDecoder) error {
	var rerr error
	got := false
	for rr.NextRow() {
		if v := rr.Values(); !got && len(v) == len(s.results) {
			got = true
			rerr = row.decode(v)
		}
	}
	if _, err := rr.Close(); err != nil {
		return err
	}
	if !got {
		return errNoRow
	}
	return rerr
}

// The binary wire formats of the few types the statements use. A NULL is a
// nil value.

func decodeInt4(b []byte) (int32, error) {
	if len(b) != 4 {
		return 0, fmt.Errorf("postgres: int4 of %d bytes", len(b))
	}
	return int32(binary.BigEndian.Uint32(b)), nil
}

func decodeInt8(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("postgres: int8 of %d bytes", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

func decodeFloat8(b []byte) (float64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("postgres: float8 of %d bytes", len(b))
	}
	return math.Float64frombits(binary.BigEndian.Uint64(b)), nil
}

func decodeBool(b []byte) (bool, error) {
	if len(b) != 1 {
		return false, fmt.Errorf("postgres: bool of %d bytes", len(b))
	}
	return b[0] != 0, nil
}

// oidAdvisoryUnlock is pg_advisory_unlock(bigint), a built-in function
// whose OID the catalog fixes (pg_proc.dat).
const oidAdvisoryUnlock uint32 = 2884

// unlockCall is fastUnlock's message, kept by the lease.
type unlockCall struct {
	msg  pgproto3.FunctionCall
	args [1][]byte
}

// binaryFormat is the one format code of a fast-path call's argument.
var binaryFormat = []uint16{1}

// fastUnlock runs pg_advisory_unlock(key) on pg as a fast-path function call
// (the protocol's FunctionCall message): no statement, so no portal, no
// executor and nothing to plan, only the function in a transaction of its
// own. On a contended lock, where every holder's release hands the lock on,
// that is about 7% of the throughput against release.sql. It cannot check
// the backend pid as release.sql does, so it runs only on a connection whose
// pid the lease's acquisition checked and that goes straight to the server
// (see the package doc, Guarantees). call is the caller's, so that nothing
// is allocated; key is the lock's key in binary. An exchange cut short (ctx
// ended, a network error) closes the connection, which ends the session and
// the lock with it. ctx bounds the exchange through a deadline on the
// connection, set when it ends (one AfterFunc, where pgx would watch ctx with
// a goroutine for every message read).
func fastUnlock(ctx context.Context, pg *pgconn.PgConn, call *unlockCall, key []byte) (unlocked bool, err error) {
	call.args[0] = key
	call.msg = pgproto3.FunctionCall{Function: oidAdvisoryUnlock, ArgFormatCodes: binaryFormat, Arguments: call.args[:], ResultFormatCode: 1}
	err = fastCall(ctx, pg, &call.msg, func(b []byte) (err error) {
		unlocked, err = decodeBool(b)
		return err
	})
	return unlocked, err
}

// syncMsg is keepAlive's message.
var syncMsg pgproto3.Sync

// keepAlive sends pg a Sync message alone, which the server answers with
// ReadyForQuery: outside a transaction it starts none (so it costs the
// server least: no statement, and no transaction end, which walks every
// lock the session holds), and like any message it restarts the session's
// idle_session_timeout. It says nothing of which backend answered: only for
// a connection that goes straight to the server, whose backend pid a
// statement checked. ctx and a failure are as in fastUnlock.
func keepAlive(ctx context.Context, pg *pgconn.PgConn) error {
	return fastCall(ctx, pg, &syncMsg, nil)
}

// fastCall sends msg, a fast-path function call (or a Sync: decode nil), on
// pg and hands its result (valid during the call only) to decode; see
// fastUnlock.
func fastCall(ctx context.Context, pg *pgconn.PgConn, msg pgproto3.FrontendMessage, decode func([]byte) error) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	synced := false
	var stop func() bool
	var fired chan struct{}
	if ctx.Done() != nil {
		fired = make(chan struct{})
		stop = context.AfterFunc(ctx, func() {
			_ = pg.Conn().SetDeadline(time.Now())
			close(fired)
		})
	}
	defer func() {
		if stop != nil && !stop() {
			<-fired
			if err != nil {
				err = errors.Join(ctx.Err(), err)
			}
			if synced { // the deadline came after the answer
				_ = pg.Conn().SetDeadline(time.Time{})
			}
		}
		if !synced && !pg.IsClosed() {
			cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			_ = pg.Close(cctx)
			cancel()
		}
	}()
	fe := pg.Frontend()
	fe.Send(msg)
	if err := fe.Flush(); err != nil {
		return err
	}
	got := false
	var serr error // the server's error, or the result's
	for {
		m, err := pg.ReceiveMessage(context.Background()) // see ctx above
		if err != nil {
			return errors.Join(serr, err)
		}
		switch m := m.(type) {
		case *pgproto3.FunctionCallResponse:
			if !got {
				got = true
				serr = decode(m.Result)
			}
		case *pgproto3.ErrorResponse:
			serr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			synced = true
			switch {
			case serr != nil:
				return serr
			case !got && decode != nil:
				return errNoRow
			}
			return nil
		}
	}
}
