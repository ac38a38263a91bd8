package postgres

import (
	_ "embed"
	"strings"
)

var (
	//go:embed acquire.sql
	acquireFile string
	//go:embed refresh.sql
	refreshFile string
	//go:embed held.sql
	heldFile string
	//go:embed release.sql
	releaseFile string

	acquireSQL = statement("acquire.sql", acquireFile)
	refreshSQL = statement("refresh.sql", refreshFile)
	heldSQL    = heldStatement(lockMatch)
	releaseSQL = statement("release.sql", releaseFile)
)

// statement is the SQL of a .sql file as it goes to the server: its comment
// lines (which document it here) replaced by a tag naming the file, so that
// pg_stat_activity shows an operator the statement (it keeps the first
// track_activity_query_size bytes of a query, 1024 by default, fewer than
// the comments).
func statement(file, text string) string {
	var b strings.Builder
	b.WriteString("/* dlock: " + file + " */")
	for line := range strings.Lines(text) {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "--") {
			b.WriteString("\n" + strings.TrimRight(line, "\n"))
		}
	}
	return b.String()
}

// The {{take}} clauses of acquire.sql. Acquire sets the session up before it
// queues, so that nothing but the fencing token is left to do once the lock
// is granted; TryAcquire sets it up only once granted, so that a busy lock
// leaves the session as it was. The ...Kept variants run on a connection kept
// from a lease of the same TTL, set up already (see driver.park).
const (
	setUp = `WHEN set_config('idle_session_timeout', $3, false) IS NULL THEN NULL
            WHEN set_config('synchronous_commit', 'off', false) IS NULL THEN NULL`
	waitTake     = setUp + "\n            " + waitTakeKept
	waitTakeKept = `WHEN pg_advisory_lock(hashtextextended($1, 0)) IS NOT NULL THEN {{fence}}`
	tryTake      = `WHEN pg_try_advisory_lock(hashtextextended($1, 0)) THEN
              CASE ` + setUp + ` ELSE {{fence}} END`
	tryTakeKept = `WHEN pg_try_advisory_lock(hashtextextended($1, 0)) THEN {{fence}}`
)

// The {{prev}} columns of acquire.sql.
const (
	prevSettings = `current_setting('idle_session_timeout') AS prev_idle,
       current_setting('synchronous_commit') AS prev_sync,`
	prevKept = `NULL::text AS prev_idle, NULL::text AS prev_sync,`
)

// The {{restore}} clauses of release.sql.
const (
	restore     = `set_config('idle_session_timeout', $3, false) IS NOT NULL AND set_config('synchronous_commit', $4, false) IS NOT NULL`
	restoreKept = `true`
)

func newAcquireStmt(sql string) *stmt {
	return newStmt(sql, []uint32{oidText, oidInt4, oidText}, []uint32{oidInt4, oidText, oidText, oidInt8, oidFloat8, oidInt8})
}

// releaseStmt is release.sql, restoring the session's settings;
// releaseKept leaves them for the connection to be parked.
var (
	releaseStmt = newReleaseStmt(restore)
	releaseKept = newReleaseStmt(restoreKept)
)

func newReleaseStmt(restore string) *stmt {
	return newReleaseStmtOf(lockUnlock, restore)
}

// newReleaseStmtOf is release.sql with unlock, the unlock of the object's
// key, and restore in place.
func newReleaseStmtOf(unlock, restore string) *stmt {
	sql := strings.ReplaceAll(releaseSQL, "{{unlock}}", unlock)
	return newStmt(strings.ReplaceAll(sql, "{{restore}}", restore), []uint32{oidInt4, oidText, oidText, oidText}, []uint32{oidBool})
}

// acquireStatement is acquire.sql with key, the advisory key of the object
// taken, take and prev in place, and fence in take.
func acquireStatement(key, take, prev, fence string) string {
	sql := strings.ReplaceAll(acquireSQL, "{{take}}", strings.ReplaceAll(take, "{{fence}}", fence))
	sql = strings.ReplaceAll(sql, "{{key}}", key)
	return strings.ReplaceAll(sql, "{{prev}}", prev)
}

// acquireRow is acquire.sql's result.
type acquireRow struct {
	pid      int32
	fence    int64 // see acquire.sql: -1, or the grant's token (when not null)
	pidCheck bool  // fence was not NULL: the statement ran on the expected backend
	waited   float64
	// release holds release.sql's parameters: the pid, the key text, and
	// the settings to restore (the pid and prev_ values as they came, in
	// one buffer; those of a parked connection are its own).
	release [4][]byte
	key     []byte // the lock's int8 key as it came (fastUnlock's argument)
}

func (r *acquireRow) decode(v [][]byte) (err error) {
	if r.pid, err = decodeInt4(v[0]); err != nil {
		return err
	}
	if r.pidCheck = v[3] != nil; r.pidCheck {
		if r.fence, err = decodeInt8(v[3]); err != nil {
			return err
		}
	}
	if r.waited, err = decodeFloat8(v[4]); err != nil {
		return err
	}
	if _, err := decodeInt8(v[5]); err != nil { // the key, kept in binary
		return err
	}
	buf := make([]byte, 0, len(v[5])+len(v[0])+len(v[1])+len(v[2]))
	buf = append(buf, v[5]...)
	k := len(buf)
	buf = append(buf, v[0]...)
	n := len(buf)
	buf = append(buf, v[1]...)
	m := len(buf)
	buf = append(buf, v[2]...)
	r.key = buf[:k:k]
	r.release[0], r.release[2], r.release[3] = buf[k:n:n], buf[n:m:m], buf[m:]
	return nil
}
