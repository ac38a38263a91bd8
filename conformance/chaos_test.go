package conformance_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/conformance"
)

// brokenServer is the toy harness with ServerFaults that always fail, as
// `docker pause` did on a loaded machine ("unable to freeze").
type brokenServer struct{ toyHarness }

var errFreeze = errors.New("toy harness: OCI runtime pause failed: unable to freeze")

func (brokenServer) PauseServer(context.Context) error   { return errFreeze }
func (brokenServer) ResumeServer(context.Context) error  { return errors.New("toy harness: not paused") }
func (brokenServer) RestartServer(context.Context) error { return errFreeze }

const harnessChildEnv = "DLOCK_TEST_CHAOS_HARNESS_CHILD"

// A server fault the harness cannot inject fails the run as the harness's
// failure, named so, and not as a property the driver broke: the run goes on
// and the toy driver, which is correct, is charged with no violation. The
// run is a child process, since it is meant to fail.
func TestChaosHarnessFault(t *testing.T) {
	if os.Getenv(harnessChildEnv) != "" {
		conformance.RunChaos(t, brokenServer{toyHarness{newToyServer()}},
			conformance.Config{TTL: 300 * time.Millisecond, Chaos: 3 * time.Second})
		return
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestChaosHarnessFault$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), harnessChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the run with a harness that cannot pause passed; want it failed:\n%s", out)
	}
	text := string(out)
	if !strings.Contains(text, "harness: could not pause the server") && !strings.Contains(text, "harness: could not restart the server") {
		t.Errorf("the failed run does not name the harness's failure:\n%s", text)
	}
	if v := regexp.MustCompile(`(?m)chaos: .* \(seed \d+\)$`).FindAllString(text, -1); v != nil {
		t.Errorf("the run charged the driver with violations: %q\n%s", v, text)
	}
}
