package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// versionMain is `dlock version` (and `dlock --version`).
func versionMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "usage: dlock version")
		return 2
	}
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprintln(stdout, versionString(bi))
	return 0
}

// versionString says which dlock this is: the module version ("(devel)"
// when built from a clone), the commit it was built from (with
// "modified" for uncommitted changes) and the Go version.
func versionString(bi *debug.BuildInfo) string {
	if bi == nil {
		return "dlock (unknown version; " + runtime.Version() + ")"
	}
	var vcs []string
	var rev, modified, when string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		case "vcs.time":
			when = s.Value
		}
	}
	if rev != "" {
		vcs = append(vcs, "commit "+rev[:min(len(rev), 12)])
		if modified == "true" {
			vcs = append(vcs, "modified")
		}
		if when != "" {
			vcs = append(vcs, when)
		}
	}
	version := bi.Main.Version
	if version == "" {
		version = "(unknown version)"
	}
	if len(vcs) == 0 {
		return fmt.Sprintf("dlock %s (%s)", version, bi.GoVersion)
	}
	return fmt.Sprintf("dlock %s (%s; %s)", version, strings.Join(vcs, ", "), bi.GoVersion)
}
