// Package servertest is the TestMain of the test binaries that start
// servers with package servers.
package servertest

import (
	"os"
	"testing"

	"github.com/dlock/dlock/internal/servers"
	"go.uber.org/goleak"
)

// Main runs the tests, removes the binary's containers (servers.CloseAll),
// then fails the binary if goroutines were left behind, and exits.
func Main(m *testing.M) { goleak.VerifyTestMain(closingM{m}) }

// closingM removes the containers after the tests and before goleak looks
// for leftover goroutines.
type closingM struct{ m *testing.M }

func (c closingM) Run() int {
	code := c.m.Run()
	if err := servers.CloseAll(); err != nil {
		os.Stderr.WriteString("closing test servers: " + err.Error() + "\n")
		if code == 0 {
			code = 1
		}
	}
	return code
}
