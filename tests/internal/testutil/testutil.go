// Package testutil holds the helpers the server tests of every driver share.
package testutil

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"
)

// RandomHex returns n random bytes in hex: unique names and prefixes, so
// that tests sharing a server do not meet.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Ctx returns the test's context bounded by a minute: a liveness bound for a
// test on a loaded machine, so that a broken driver fails instead of hanging
// the run.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
