package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A result that held fewer leases than asked shows no heap per lease (a
// figure over a handful says nothing of N), and says why and what to set.
func TestWriteHoldShort(t *testing.T) {
	results := []HoldResult{
		{Backend: "redis", N: 100, Acquired: 100, TTL: time.Second, HeapPerLease: 812, Conns: 10, ServerCPU: -1},
		{Backend: "postgres", N: 1000, Acquired: 32, TTL: time.Second, HeapPerLease: 0, Conns: 32, ServerCPU: -1,
			Limited: true, Advice: "add shared_sessions=true", Errors: []string{"acquire: all 32 connections of the pool are in use"}},
		{Backend: "etcd", N: 10, Acquired: 7, TTL: time.Second, ServerCPU: -1},
	}
	var text bytes.Buffer
	if err := WriteHoldText(&text, HoldConfig{}, results); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	for _, want := range []string{
		"SHORT postgres N=1000: held 32 of 1000 leases: the client ran out of a resource (ERROR below); to hold more,\nadd shared_sessions=true",
		"SHORT etcd N=10: held 7 of 10 leases within the budget (-budget)",
		"812 B",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "SHORT redis") {
		t.Errorf("redis held every lease, but is SHORT:\n%s", out)
	}
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 8 && (f[0] == "postgres" || f[0] == "etcd") && f[8] != "-" {
			t.Errorf("heap/lease of a short result = %q, want -: %s", f[8], line)
		}
	}
	var md bytes.Buffer
	if err := WriteHold(&md, FormatMarkdown, HoldConfig{}, results); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| postgres | 1000 | 1s | 32 |") || !strings.Contains(md.String(), "| 32 | - | 0 |") ||
		!strings.Contains(md.String(), "SHORT postgres N=1000") {
		t.Errorf("markdown:\n%s", md.String())
	}
	var js bytes.Buffer
	if err := WriteHold(&js, FormatJSON, HoldConfig{}, results); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Heap  *int64 `json:"heap_per_lease_bytes"`
			Limit bool   `json:"resource_limit"`
		}
	}
	if err := json.Unmarshal(js.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if r := rep.Results; len(r) != 3 || r[0].Heap == nil || *r[0].Heap != 812 || r[1].Heap != nil || !r[1].Limit || r[2].Heap != nil {
		t.Errorf("JSON: %s", js.String())
	}
}
