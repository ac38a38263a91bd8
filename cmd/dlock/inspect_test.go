package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlocktest"
)

// dlock inspect on mem:// (in this process, so it sees the test's locks): a
// table row and a JSON object per name in use, with the holder's token
// prefix (never the whole token), metadata, fence and TTL; a free name is
// not held; usage errors are status 2.
func TestInspect(t *testing.T) {
	ctx := t.Context()
	l, err := dlock.Open(ctx, "mem://inspect-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ls, err := l.Acquire(ctx, "jobs/nightly", &dlock.Options{TTL: time.Minute, Metadata: "host=a"})
	if err != nil {
		t.Fatal(err)
	}
	fence, _ := ls.Fence()

	code, out, errOut := runCmd(t, "inspect", "mem://inspect-test", "-prefix", "jobs/")
	if code != 0 {
		t.Fatalf("status %d; stderr:\n%s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("table:\n%s\nwant a header and one row", out)
	}
	row := strings.Fields(lines[1])
	if row[0] != "jobs/nightly" || row[1] != "yes" || row[2] != ls.Token()[:8] || !strings.Contains(lines[1], "host=a") ||
		!strings.Contains(lines[1], " "+strconv.FormatUint(fence, 10)+" ") {
		t.Errorf("row %q: want jobs/nightly, held, token prefix %s, metadata host=a, fence %d", lines[1], ls.Token()[:8], fence)
	}
	if strings.Contains(out, ls.Token()) {
		t.Error("the table shows the whole token")
	}

	code, out, errOut = runCmd(t, "inspect", "-json", "mem://inspect-test", "jobs/nightly")
	if code != 0 {
		t.Fatalf("-json: status %d; stderr:\n%s", code, errOut)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 {
		t.Fatalf("-json output %q: %v", out, err)
	}
	if got[0]["held"] != true || got[0]["token_prefix"] != ls.Token()[:8] || got[0]["fence"] != float64(fence) ||
		got[0]["metadata"] != "host=a" || got[0]["ttl_ms"].(float64) > 60000 {
		t.Errorf("-json: %v", got[0])
	}

	if code, out, _ := runCmd(t, "inspect", "-json", "mem://inspect-test", "free"); code != 0 || !strings.Contains(out, `"held": false`) {
		t.Errorf("a free name: status %d, %s", code, out)
	}
	for _, args := range [][]string{{"inspect"}, {"inspect", "mem://", "a", "b"}, {"inspect", "-prefix", "x", "mem://", "a"}, {"inspect", "nosuch://x"}} {
		if code, _, _ := runCmd(t, args...); code != exitUsage {
			t.Errorf("%q: status %d, want %d", args, code, exitUsage)
		}
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runCmd(t, "inspect", "mem://inspect-test"); code != 0 || strings.Contains(out, "jobs/nightly") {
		t.Errorf("after release: status %d, table still lists the name:\n%s", code, out)
	}
}

// dlock inspect on a mysql:// server shows the holding session's
// connection (another process's Locker: the fence is unknown there).
func TestInspectMySQL(t *testing.T) {
	ctx := t.Context()
	u := "mysql://" + dlocktest.MariaDBUser + ":" + dlocktest.MariaDBPassword + "@" +
		dlocktest.Require(t, dlocktest.MariaDB).Addr() + "/" + dlocktest.MariaDBDatabase
	l, err := dlock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	name := "inspect-" + t.Name()
	ls, err := l.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(context.Background())
	code, out, errOut := runCmd(t, "inspect", "-json", u, name)
	if code != 0 {
		t.Fatalf("status %d; stderr:\n%s", code, errOut)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 {
		t.Fatalf("-json output %q: %v", out, err)
	}
	if h, _ := got[0]["holder"].(string); got[0]["held"] != true || !strings.HasPrefix(h, "connection ") {
		t.Errorf("-json: %v, want held by a connection", got[0])
	}
}
