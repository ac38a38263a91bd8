// Package scripts_test tests the repository's shell scripts.
package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeApt is an apt-get that records its environment and arguments, talks
// on both streams as apt and needrestart do, and fails its install when
// FAKE_APT_FAIL is set.
const fakeApt = `#!/bin/sh
echo "$* DEBIAN_FRONTEND=$DEBIAN_FRONTEND NEEDRESTART_SUSPEND=$NEEDRESTART_SUSPEND" >>"$FAKE_APT_RECORD"
echo "Reading package lists..."
echo "readline() on closed filehandle HENV at /usr/sbin/needrestart line 42." >&2
if [ "$1" = install ] && [ -n "$FAKE_APT_FAIL" ]; then echo "E: Unable to locate package $FAKE_APT_FAIL" >&2; exit 100; fi
exit 0
`

// scripts/apt-install.sh keeps apt's and needrestart's chatter out of the
// output (in a log), passes apt a non-interactive frontend and a suspended
// needrestart, and shows the log when apt fails.
func TestAptInstallQuiet(t *testing.T) {
	bin := t.TempDir()
	for name, script := range map[string]string{"apt-get": fakeApt, "sudo": "#!/bin/sh\nexec \"$@\"\n"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	record := filepath.Join(t.TempDir(), "record")
	run := func(fail string) (string, error) {
		c := exec.Command("bash", "../../scripts/apt-install.sh", "etcd-client", "chromium")
		c.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "FAKE_APT_RECORD="+record,
			"FAKE_APT_FAIL="+fail, "DLOCK_APT_LOG="+filepath.Join(t.TempDir(), "apt.log"))
		out, err := c.CombinedOutput()
		return string(out), err
	}

	out, err := run("")
	if err != nil || out != "" {
		t.Errorf("install: got %v and output %q, want success and no output", err, out)
	}
	rec, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"update -qq DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1",
		"install -y -qq -o Dpkg::Use-Pty=0 etcd-client chromium DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1",
	} {
		if !strings.Contains(string(rec), want) {
			t.Errorf("apt-get calls:\n%s\nlack %q", rec, want)
		}
	}

	out, err = run("chromium")
	if err == nil || !strings.Contains(out, "failed") || !strings.Contains(out, "Unable to locate package chromium") {
		t.Errorf("failing install: got %v and output %q, want a failure showing apt's log", err, out)
	}
}
