// Package ident checks and quotes the table names that the mysql module's
// drivers take from their options and URLs (the lock driver's fence table,
// the queue driver's task table).
package ident

import (
	"fmt"
	"strings"
)

// CheckTable reports, naming what the table is for ("fence table"), a
// name that is not one or two plain identifiers, name or schema.name, of
// letters, digits, _ and $, at most 64 each: what Quote can quote without
// escaping.
func CheckTable(what, name string) error {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return fmt.Errorf("%s %q: want name or schema.name", what, name)
	}
	for _, p := range parts {
		if p == "" || len(p) > 64 || strings.TrimLeft(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$") != "" {
			return fmt.Errorf("%s %q: want letters, digits, _ or $, at most 64 each side of the dot", what, name)
		}
	}
	return nil
}

// Quote quotes a name CheckTable accepted as an identifier.
func Quote(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = "`" + p + "`"
	}
	return strings.Join(parts, ".")
}
