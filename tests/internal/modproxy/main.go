// Command modproxy writes a file-based Go module proxy (GOPROXY=file://DIR)
// serving the committed tree of this repository's modules at one version, as
// a release would publish them: scripts/release-check.sh installs and builds
// against it with an empty module cache.
//
//	go run ./tests/internal/modproxy -version v1.0.0-rc.0 -rev HEAD -o DIR
//
// Each module's zip is made from the revision with git (golang.org/x/mod/zip
// CreateFromVCS), so only committed files are served, and nested modules are
// left out of their parent's zip as the go command does.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	version := flag.String("version", "v1.0.0-rc.0", "the version to serve every module at")
	rev := flag.String("rev", "HEAD", "the git revision to serve")
	out := flag.String("o", "", "the proxy directory to write (required)")
	flag.Parse()
	if *out == "" {
		log.Fatal("modproxy: -o is required")
	}
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		log.Fatalf("modproxy: not in a git repository: %v", err)
	}
	repo := strings.TrimSpace(string(root))
	dirs, err := moduleDirs(repo, *rev)
	if err != nil {
		log.Fatal(err)
	}
	for _, dir := range dirs {
		if err := serve(repo, *rev, dir, *version, *out); err != nil {
			log.Fatal(err)
		}
	}
}

// moduleDirs lists the directories (relative to the repository, "" for its
// root) holding a go.mod at rev.
func moduleDirs(repo, rev string) ([]string, error) {
	ls, err := exec.Command("git", "-C", repo, "ls-tree", "-r", "--name-only", rev).Output()
	if err != nil {
		return nil, fmt.Errorf("modproxy: git ls-tree: %v", err)
	}
	var dirs []string
	for _, f := range strings.Split(strings.TrimSpace(string(ls)), "\n") {
		if f == "go.mod" {
			dirs = append(dirs, "")
		} else if d, ok := strings.CutSuffix(f, "/go.mod"); ok && !strings.Contains(d, "testdata") {
			dirs = append(dirs, d)
		}
	}
	return dirs, nil
}

func serve(repo, rev, dir, version, out string) error {
	spec := rev + ":" + filepath.ToSlash(filepath.Join(dir, "go.mod"))
	if dir == "" {
		spec = rev + ":go.mod"
	}
	gomod, err := exec.Command("git", "-C", repo, "show", spec).Output()
	if err != nil {
		return fmt.Errorf("modproxy: git show %s: %v", spec, err)
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return fmt.Errorf("modproxy: %s: no module line", spec)
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	at := filepath.Join(out, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	var z bytes.Buffer
	if err := zip.CreateFromVCS(&z, module.Version{Path: path, Version: version}, repo, rev, dir); err != nil {
		return fmt.Errorf("modproxy: zip of %s: %v", path, err)
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC()})
	files := map[string][]byte{
		version + ".mod":  gomod,
		version + ".zip":  z.Bytes(),
		version + ".info": info,
		"list":            []byte(version + "\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("modproxy: %s@%s (%d KB)\n", path, version, z.Len()/1024)
	return nil
}
