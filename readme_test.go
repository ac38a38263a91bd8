package dlock_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every Go snippet of the README is taken from a test file that runs in CI:
// its first line, "// from PATH", names the file, and each of its
// paragraphs (blank-line separated) appears in that file, in order, as
// consecutive lines (indented alike). A file of the root module must be an
// example with "// Output:" (it runs without a server); one of the tests
// module runs its snippet against a server.
func TestReadmeSnippets(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	snippets := regexp.MustCompile("(?ms)^```go\n(.*?)^```").FindAllSubmatch(readme, -1)
	if len(snippets) == 0 {
		t.Fatal("no Go snippet found in README.md")
	}
	from := regexp.MustCompile(`^// from (\S+_test\.go)\b`)
	for i, m := range snippets {
		lines := strings.Split(strings.TrimSuffix(string(m[1]), "\n"), "\n")
		t.Run(fmt.Sprint(i+1), func(t *testing.T) {
			f := from.FindStringSubmatch(lines[0])
			if f == nil {
				t.Fatalf("snippet %d begins %q, want \"// from PATH_test.go\"", i+1, lines[0])
			}
			src, err := os.ReadFile(f[1])
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(f[1], "tests/") && !strings.Contains(string(src), "// Output:") {
				t.Errorf("%s has no example with // Output: (it would not run)", f[1])
			}
			if err := contains(strings.Split(string(src), "\n"), lines[1:]); err != nil {
				t.Errorf("README snippet %d is not in %s: %v", i+1, f[1], err)
			}
		})
	}
}

// contains reports whether each paragraph of snippet is a run of
// consecutive lines of src, after the previous one, each line of a run
// being the snippet's line behind one common indentation of tabs.
func contains(src, snippet []string) error {
	at := 0
	for len(snippet) > 0 {
		for len(snippet) > 0 && snippet[0] == "" {
			snippet = snippet[1:]
		}
		n := 0
		for n < len(snippet) && snippet[n] != "" {
			n++
		}
		if n == 0 {
			break
		}
		para := snippet[:n]
		snippet = snippet[n:]
		found := false
		for i := at; i+n <= len(src) && !found; i++ {
			indent, ok := strings.CutSuffix(src[i], para[0])
			if !ok || strings.Trim(indent, "\t") != "" {
				continue
			}
			found = true
			for k := 1; k < n && found; k++ {
				found = src[i+k] == indent+para[k]
			}
			if found {
				at = i + n
			}
		}
		if !found {
			return fmt.Errorf("no run of lines (after line %d) matches the paragraph beginning %q", at, para[0])
		}
	}
	return nil
}

// contains finds paragraphs in order and with one indentation, and misses
// a changed line, a wrong order and a changed indentation.
func TestReadmeContains(t *testing.T) {
	src := strings.Split("func f() {\n\ta := 1\n\tb := 2\n\n\tif a < b {\n\t\treturn\n\t}\n}", "\n")
	for _, tc := range []struct {
		snippet string
		ok      bool
	}{
		{"a := 1\nb := 2\n\nif a < b {\n\treturn\n}", true},
		{"a := 1\nb := 3", false},
		{"if a < b {\n\treturn\n}\n\na := 1", false},
		{"if a < b {\nreturn\n}", false},
	} {
		err := contains(src, strings.Split(tc.snippet, "\n"))
		if (err == nil) != tc.ok {
			t.Errorf("contains(%q): got %v, want ok %v", tc.snippet, err, tc.ok)
		}
	}
}
