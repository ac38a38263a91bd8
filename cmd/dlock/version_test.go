package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// dlock version and dlock --version print the module version, the commit
// and the Go version, and exit 0.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, out, errOut := runCmd(t, args...)
		if code != 0 {
			t.Errorf("%v: status %d, want 0; stderr:\n%s", args, code, errOut)
		}
		if !strings.HasPrefix(out, "dlock ") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("%v: got %q, want dlock's version and %s", args, out, runtime.Version())
		}
	}
	if code, _, _ := runCmd(t, "version", "extra"); code != 2 {
		t.Errorf("version extra: status %d, want 2", code)
	}
}

func TestVersionString(t *testing.T) {
	for _, tt := range []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}},
			"dlock v1.2.3 (go1.26.0)"},
		{&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-11-27T23:00:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			"dlock (devel) (commit 0123456789ab, modified, 2026-11-27T23:00:00Z; go1.26.0)"},
		{nil, "dlock (unknown version; " + runtime.Version() + ")"},
	} {
		if got := versionString(tt.bi); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}
