package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	_ "github.com/dlock/dlock/memory"
)

// The nemesis's schedule is a function of the seed: replayable, bounded by
// the fault phase, and different for another seed.
func TestFaultScheduleSeeded(t *testing.T) {
	const d, ttl = 20 * time.Second, time.Second
	a := faultSchedule(42, 4, 5, d, ttl)
	if b := faultSchedule(42, 4, 5, d, ttl); !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 42 twice: different schedules:\n%v\n%v", a, b)
	}
	if c := faultSchedule(43, 4, 5, d, ttl); reflect.DeepEqual(a, c) {
		t.Fatalf("seeds 42 and 43: the same schedule %v", a)
	}
	if len(a) != 5 {
		t.Fatalf("%d lists, want 4 paths and the servers", len(a))
	}
	kinds, groups := map[string]int{}, map[int]int{}
	for i, steps := range a {
		if len(steps) == 0 {
			t.Errorf("list %d: no fault in %v", i, d)
		}
		var prevEnd time.Duration
		for _, s := range steps {
			kinds[s.Kind]++
			switch {
			case s.At < prevEnd:
				t.Errorf("list %d: %+v starts before the previous fault ended (%v)", i, s, prevEnd)
			case s.At+s.For > d:
				t.Errorf("list %d: %+v ends after the fault phase (%v)", i, s, d)
			case i == 4 && (s.Kind != FaultPause && s.Kind != FaultRestart || len(s.Nodes) == 0 || len(s.Nodes) > 3 ||
				s.Nodes[0] < 0 || s.Nodes[len(s.Nodes)-1] >= 5 || !slices.IsSorted(s.Nodes) || len(slices.Compact(slices.Clone(s.Nodes))) != len(s.Nodes)):
				t.Errorf("servers: %+v, want a pause or restart of 1-3 distinct nodes of 0-4", s)
			case i == 4:
				groups[len(s.Nodes)]++
			case i < 4 && (s.Kind == FaultPause || s.Kind == FaultRestart || s.Client != i):
				t.Errorf("path %d: %+v", i, s)
			case s.Kind == FaultLatency && (s.Latency <= 0 || s.For <= 0):
				t.Errorf("path %d: %+v, want a latency for a window", i, s)
			}
			prevEnd = s.At + s.For
		}
	}
	for _, k := range FaultKinds {
		if kinds[k] == 0 {
			t.Errorf("no %s in %v", k, kinds)
		}
	}
	// Of five redlock nodes: one, a minority (2) and a majority (3), over
	// two minutes.
	for _, s := range faultSchedule(42, 1, 5, 2*time.Minute, ttl)[1] {
		groups[len(s.Nodes)]++
	}
	if groups[1] == 0 || groups[2] == 0 || groups[3] == 0 {
		t.Errorf("server faults by nodes hit: %v, want 1, 2 and 3", groups)
	}
	if s := faultSchedule(42, 2, 0, d, ttl); len(s[2]) != 0 {
		t.Errorf("no server to pause, yet %v", s[2])
	}
}

// The checks over recorded intervals: an overlap is counted once per pair,
// the earlier holder's loss as unreported with how long it kept working;
// a reported loss gives a latency; the longest gap and recovery come from
// the grants.
func TestFaultsCheck(t *testing.T) {
	epoch := time.Now()
	at := func(ms int) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	newRun := func(lib faultsLib, caps dlock.Capabilities) (*faultsRun, *FaultsRow) {
		row := &FaultsRow{Recovery: -1, RecoveryAll: -1, UnreportedFor: -1, LossReportP50: -1, LossReportP99: -1}
		return &faultsRun{cfg: FaultsConfig{Clients: 2}, lib: lib, caps: caps, epoch: epoch, row: row}, row
	}

	r, row := newRun(faultsLib{name: "x"}, dlock.Capabilities{})
	r.leases = []*faultsLease{
		{client: 0, seq: 0, call: at(0), grant: at(10), end: at(100), ended: "release"},
		// Granted while client 0 still believed it held the lock.
		{client: 1, seq: 1, call: at(20), grant: at(60), end: at(80), ended: "release"},
		// Lost, reported at 150; its validity ran to 140.
		{client: 1, seq: 2, call: at(100), grant: at(110), end: at(150), ended: "loss", reported: at(150), validUntil: at(140)},
		{client: 0, seq: 3, call: at(120), grant: at(400), end: at(410), ended: "release"},
		{client: 1, seq: 4, call: at(410), grant: at(450), end: at(460), ended: "release"},
	}
	r.windows = []faultWindow{{client: 0, kind: FaultBlackhole, from: at(200), to: at(300)}}
	r.check(at(500))
	want := FaultsRow{
		Grants: 5, Overlaps: 1, LongestOverlap: 20 * time.Millisecond,
		LossesReported: 1, LossesUnreported: 1, UnreportedFor: 40 * time.Millisecond,
		LossReportN: 1, LossReportP50: 10 * time.Millisecond, LossReportP99: 10 * time.Millisecond,
		Recovery: 100 * time.Millisecond, RecoveryAll: 150 * time.Millisecond, LongestGap: 290 * time.Millisecond,
	}
	tl := row.Timeline
	row.Timeline = nil
	if !reflect.DeepEqual(*row, want) {
		t.Errorf("got  %+v\nwant %+v", *row, want)
	}
	// The timeline: each interval as held, the fault, the overlap.
	wantTL := &FaultsTimeline{Phase: tl.Phase, End: 500,
		Held: []TimelineSpan{{Client: 0, From: 10, To: 100, Kind: "release"}, {Client: 1, From: 60, To: 80, Kind: "release"}, {Client: 1, From: 110, To: 150, Kind: "loss"},
			{Client: 0, From: 400, To: 410, Kind: "release"}, {Client: 1, From: 450, To: 460, Kind: "release"}},
		Faults:   []TimelineSpan{{Client: 0, From: 200, To: 300, Kind: FaultBlackhole}},
		Overlaps: []TimelineSpan{{Client: 0, Other: 1, From: 60, To: 80, Kind: "overlap"}},
	}
	if !reflect.DeepEqual(tl, wantTL) {
		t.Errorf("timeline\ngot  %+v\nwant %+v", tl, wantTL)
	}

	// The same overlap on a ConnectionBound dlock row, the holder's path
	// reset while it held the lock: excused, and said why.
	r, row = newRun(faultsLib{name: "dlock", dlock: true}, dlock.Capabilities{ConnectionBound: true})
	r.leases = []*faultsLease{
		{client: 0, seq: 0, call: at(0), grant: at(10), end: at(100), ended: "release"},
		{client: 1, seq: 1, call: at(20), grant: at(60), end: at(80), ended: "release"},
	}
	r.windows = []faultWindow{{client: 0, kind: FaultReset, from: at(30), to: at(30)}}
	r.check(at(100))
	if row.Overlaps != 0 || row.Excused != 1 || len(row.Why) != 1 || row.LossesUnreported != 0 {
		t.Errorf("ConnectionBound reset: overlaps %d, excused %d (%v), unreported %d; want 0, 1, 0",
			row.Overlaps, row.Excused, row.Why, row.LossesUnreported)
	}
	// A reset of the other client's path excuses nothing.
	r, row = newRun(faultsLib{name: "dlock", dlock: true}, dlock.Capabilities{ConnectionBound: true})
	r.leases = []*faultsLease{
		{client: 0, seq: 0, call: at(0), grant: at(10), end: at(100), ended: "release"},
		{client: 1, seq: 1, call: at(20), grant: at(60), end: at(80), ended: "release"},
	}
	r.windows = []faultWindow{{client: 1, kind: FaultReset, from: at(30), to: at(30)}}
	r.check(at(100))
	if row.Overlaps != 1 || row.Excused != 0 {
		t.Errorf("reset of the other path: overlaps %d, excused %d; want 1, 0", row.Overlaps, row.Excused)
	}
}

// The unfenced log takes a stale holder's write out of order; the fenced
// store refuses it.
func TestFaultsWrites(t *testing.T) {
	r := &faultsRun{row: &FaultsRow{}}
	older := &faultsLease{seq: 0}
	newer := &faultsLease{seq: 1}
	r.write(older, 5, true)
	r.write(newer, 6, true)
	r.write(older, 5, true) // woke after the newer holder wrote
	if r.row.OutOfOrder != 1 || r.row.FencedRefused != 1 || !older.refused || newer.refused {
		t.Errorf("out of order %d, refused %d (older %v, newer %v); want 1, 1 (true, false)",
			r.row.OutOfOrder, r.row.FencedRefused, older.refused, newer.refused)
	}
}

// On memory, dlock's clients exclude each other: grants and no overlap, no
// write refused or out of order; in sanity mode (a store each) the same
// checker sees overlaps.
func TestFaultsMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	target := func(sanity bool) FaultsTarget {
		return FaultsTarget{Backend: "memory", URL: "mem://faults-test", Via: func(client int, _ []string) string {
			if sanity {
				return "mem://faults-test-sanity-" + string(rune('a'+client))
			}
			return "mem://faults-test"
		}}
	}
	cfg := FaultsConfig{Clients: 3, Duration: 400 * time.Millisecond, TTL: 100 * time.Millisecond, Long: 0.2, Seed: 1}
	rep := RunFaults(ctx, cfg, []FaultsTarget{target(false)})
	if len(rep.Rows) != 1 {
		t.Fatalf("%d rows, want 1: %+v", len(rep.Rows), rep.Rows)
	}
	row := rep.Rows[0]
	if row.Library != "dlock" || row.Grants == 0 || row.Overlaps != 0 || row.FencedRefused != 0 || row.OutOfOrder != 0 ||
		row.LossesUnreported != 0 || row.Hung != 0 || len(row.Errors) > 0 || !row.Fenced {
		t.Errorf("normal run: %+v\nwant dlock, grants, fenced, no overlap, refusal, out-of-order write, unreported loss, hang or error", row)
	}

	cfg.Sanity, cfg.Clients = true, 2
	rep = RunFaults(ctx, cfg, []FaultsTarget{target(true)})
	if len(rep.Rows) != 1 || rep.Rows[0].Overlaps == 0 || rep.Rows[0].Grants == 0 {
		t.Fatalf("sanity run: %+v\nwant overlaps", rep.Rows)
	}
	if row := rep.Rows[0]; row.LossesUnreported == 0 || row.UnreportedFor <= 0 {
		t.Errorf("sanity run: %d unreported losses for %v, want some", row.LossesUnreported, row.UnreportedFor)
	}

	// Both renderings carry the row.
	var text, js bytes.Buffer
	if err := WriteFaults(&text, FormatText, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "SANITY") || !slices.ContainsFunc(strings.Split(text.String(), "\n"), func(l string) bool {
		return strings.HasPrefix(l, "dlock")
	}) {
		t.Errorf("text report lacks the sanity header or the dlock row:\n%s", text.String())
	}
	if err := WriteFaults(&js, FormatJSON, rep); err != nil {
		t.Fatal(err)
	}
	var back FaultsReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Rows) != 1 || back.Rows[0].Overlaps != rep.Rows[0].Overlaps {
		t.Errorf("JSON report: %v, %+v", err, back)
	}
}
