package mysql

import (
	_ "embed"
	"encoding/hex"
	"strconv"
	"strings"
)

// The statements, one per file with a header naming its parameters. The
// header is cut off before a statement is sent (stripHeader).
var (
	//go:embed try.sql
	trySQL string
	//go:embed try_fence.sql
	tryFenceSQL string
	//go:embed wait.sql
	waitSQL string
	//go:embed kill.sql
	killSQL string
	//go:embed fence.sql
	fenceSQL string
	//go:embed fence_create.sql
	fenceCreateSQL string
	//go:embed idle.sql
	idleSQL string
	//go:embed held.sql
	heldSQL string
	//go:embed release.sql
	releaseSQL string
	//go:embed inspect.sql
	inspectSQL string
)

func init() {
	for _, s := range []*string{&trySQL, &tryFenceSQL, &waitSQL, &killSQL, &fenceSQL, &fenceCreateSQL, &idleSQL, &heldSQL, &releaseSQL, &inspectSQL} {
		*s = stripHeader(*s)
	}
}

// The session settings a lease changes on its connection, and puts back
// before the connection returns to the pool. $SECS is the TTL in seconds.
const (
	setTimeoutSQL   = "SET SESSION wait_timeout = $SECS"
	resetTimeoutSQL = "SET SESSION wait_timeout = DEFAULT"
)

// batch joins statements into one request, for the driver's own pools
// (Options of open and NewFromConfig turn on the client's multiStatements).
func batch(stmts ...string) string { return strings.Join(stmts, ";\n") }

// stripHeader cuts a statement file's leading comment lines: they document
// the file and need not cross the network with every request.
func stripHeader(s string) string {
	for strings.HasPrefix(s, "--") {
		_, s, _ = strings.Cut(s, "\n")
	}
	return strings.TrimSpace(s)
}

// fill puts values into a statement's placeholders, given as pairs
// ("$KEY", literal(key), …) and replaced in one pass, so that a value (a
// table name may hold a $) is never taken for a placeholder. Statements
// carry their values as literals rather than as parameters: the client
// library runs a statement with parameters as a prepared statement, a
// round trip to prepare it before the one to run it.
func fill(stmt string, pairs ...string) string { return strings.NewReplacer(pairs...).Replace(stmt) }

// num is n as a placeholder's value.
func num(n int64) string { return strconv.FormatInt(n, 10) }

// literal is s as an SQL string literal: its bytes as a hexadecimal
// literal with the utf8mb4 introducer, which is the string s in any
// sql_mode and connection character set and needs no escaping (and what a
// client's 'billing/nightly-invoices' is, for an ASCII name).
func literal(s string) string { return "_utf8mb4 X'" + hex.EncodeToString([]byte(s)) + "'" }

// withTable puts the fence table's quoted name into a statement.
func withTable(stmt, table string) string { return strings.ReplaceAll(stmt, "$TABLE", table) }
