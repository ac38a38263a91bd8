package mysql

import (
	_ "embed"
	"strings"
)

// The statements, one per file with a header naming its parameters.
var (
	//go:embed try.sql
	trySQL string
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

// The session settings a lease changes on its connection, and puts back
// before the connection returns to the pool.
const (
	setTimeoutSQL   = "SET SESSION wait_timeout = ?"
	resetTimeoutSQL = "SET SESSION wait_timeout = DEFAULT"
)

// withTable puts the fence table's quoted name into a statement.
func withTable(stmt, table string) string { return strings.ReplaceAll(stmt, "$TABLE", table) }

// quoteIdent quotes a name, or a schema-qualified one, as an identifier.
// The name has been checked by validTable.
func quoteIdent(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = "`" + p + "`"
	}
	return strings.Join(parts, ".")
}

// validTable rejects table names that are not one or two plain
// identifiers (letters, digits, _ and $).
func validTable(name string) error {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return invalid("fence table %q: want name or schema.name", name)
	}
	for _, p := range parts {
		if p == "" || len(p) > 64 || strings.TrimLeft(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$") != "" {
			return invalid("fence table %q: want letters, digits, _ or $, at most 64 each side of the dot", name)
		}
	}
	return nil
}
