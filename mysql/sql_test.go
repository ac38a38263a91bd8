package mysql

import (
	"strings"
	"testing"
)

// The statements cross the network without their files' headers, and
// carry no parameters (each would cost a round trip to prepare).
func TestStatements(t *testing.T) {
	for name, s := range map[string]string{
		"try": trySQL, "try_fence": tryFenceSQL, "wait": waitSQL, "kill": killSQL, "fence": fenceSQL,
		"fence_create": fenceCreateSQL, "idle": idleSQL, "held": heldSQL, "release": releaseSQL, "inspect": inspectSQL,
	} {
		if strings.Contains(s, "--") || strings.Contains(s, "?") || s == "" {
			t.Errorf("%s.sql as sent: %q, want a statement without comments or parameters", name, s)
		}
	}
	if n := len(strings.Split(tryFenceSQL, ";\n")); n != 3 {
		t.Errorf("try_fence.sql: %d statements, want 3", n)
	}
	if n := len(strings.Split(killSQL, ";\n")); n != 2 {
		t.Errorf("kill.sql: %d statements, want 2", n)
	}
}

// A value is never taken for a placeholder, and a name needs no escaping.
func TestFill(t *testing.T) {
	for _, c := range []struct{ stmt, table, key, want string }{
		{"SELECT GET_LOCK($KEY, 0)", "", "a'b\\", `SELECT GET_LOCK(_utf8mb4 X'6127625c', 0)`},
		{"UPDATE $TABLE SET n = 1 WHERE $KEY", "`x$KEY`", "é", "UPDATE `x$KEY` SET n = 1 WHERE _utf8mb4 X'c3a9'"},
	} {
		if got := fill(c.stmt, "$TABLE", c.table, "$KEY", literal(c.key)); got != c.want {
			t.Errorf("fill(%q) = %q, want %q", c.stmt, got, c.want)
		}
	}
}
