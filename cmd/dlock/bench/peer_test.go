package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlock/dlock"
)

// sampleReportPeers is sampleReport with two peers on redis, one of which
// failed a scenario.
func sampleReportPeers() *Report {
	r := sampleReport()
	b := &r.Backends[0]
	lat := func(p50 time.Duration) *Latency {
		return &Latency{N: 100, P50: p50, P99: 2 * p50, Mean: p50, Max: 2 * p50}
	}
	thr := func(ops float64) *Throughput {
		t := &Throughput{Elapsed: time.Second}
		Spread(t, []int64{50, 100})
		t.OpsPerSec = ops
		return t
	}
	b.Peers = []Result{
		{Client: "redsync", Module: "github.com/go-redsync/redsync/v4", Version: "v4.18.1", About: "one pool",
			Uncontended: lat(120 * time.Microsecond), Handoff: lat(5 * time.Millisecond),
			Contended: thr(4000), Independent: thr(25000)},
		{Client: "redislock", Module: "github.com/bsm/redislock", About: "linear backoff",
			Uncontended: lat(90 * time.Microsecond), Handoff: lat(6 * time.Millisecond),
			Contended: thr(6000), Errors: []string{"independent: boom2"}},
	}
	b.computePeerRatios()
	return r
}

func TestPeerRatios(t *testing.T) {
	vs := sampleReportPeers().Backends[0].VsPeers
	if vs == nil {
		t.Fatal("VsPeers = nil, want ratios")
	}
	const eps = 1e-9
	for _, c := range []struct {
		name string
		got  *PeerRatio
		peer string
		want float64
	}{
		{"uncontended: the lowest p50", vs.Uncontended, "redislock", 105.0 / 90},
		{"handoff: the lowest p50", vs.Handoff, "redsync", 210.0 / 5000},
		{"contended: the most ops/s", vs.Contended, "redislock", 5000.0 / 6000},
		{"independent: a failed peer left out", vs.Independent, "redsync", 20000.0 / 25000},
	} {
		if c.got == nil || c.got.Peer != c.peer || c.got.Ratio < c.want-eps || c.got.Ratio > c.want+eps {
			t.Errorf("%s = %+v, want %s at %v", c.name, c.got, c.peer, c.want)
		}
	}
	if vs := sampleReport().Backends[0].VsPeers; vs != nil {
		t.Errorf("VsPeers without peers = %+v, want nil", vs)
	}
	// dlock failed: no ratio.
	b := sampleReportPeers().Backends[0]
	b.Dlock.Handoff = nil
	b.computePeerRatios()
	if b.VsPeers.Handoff != nil || b.VsPeers.Uncontended == nil {
		t.Errorf("VsPeers with dlock's handoff missing = %+v, want no handoff ratio only", b.VsPeers)
	}
}

func TestWriteTextPeers(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReportPeers().WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		peersTitle,
		"0.86× redislock", "23.81× redsync", "0.83× redislock", "0.80× redsync",
		"redis redsync (github.com/go-redsync/redsync/v4 v4.18.1): one pool",
		"redis redislock (github.com/bsm/redislock): linear backoff",
		"ERROR redis redislock independent: boom2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
	// The side-by-side table has a row per figure, a column per client,
	// aligned, in at most MaxTextWidth columns.
	lines := textLines(t, out)
	var side []string
	for i, l := range lines {
		if strings.HasPrefix(l, "redis ") && strings.Contains(l, peerHeader) {
			side = lines[i : i+8]
		}
	}
	if side == nil {
		t.Fatalf("no side-by-side table for redis:\n%s", out)
	}
	for _, f := range []string{"unc p50", "unc p99", "handoff p50", "handoff p99", "cont ops/s", "cont fairness", "indep ops/s"} {
		if !strings.Contains(strings.Join(side, "\n"), f) {
			t.Errorf("side-by-side table lacks the %q row:\n%s", f, strings.Join(side, "\n"))
		}
	}
	for _, head := range []string{"redsync", "redislock", peerHeader} {
		col := utf8.RuneCountInString(side[0][:strings.Index(side[0], head)])
		for _, l := range side[1:] {
			if r := []rune(l); len(r) > col && (r[col-1] != ' ' || r[col] == ' ') {
				t.Errorf("row not aligned with %q at rune %d:\n%s\n%s", head, col, side[0], l)
			}
		}
	}
	if !strings.Contains(side[7], "ERR") {
		t.Errorf("indep row does not show redislock's failure: %s", side[7])
	}
	// memory has no peers: no table of its own.
	if got := strings.Count(out, peerHeader); got != 1 {
		t.Errorf("%q appears %d times, want 1 (one side-by-side table):\n%s", peerHeader, got, out)
	}
}

// Without peers the reports say nothing of them.
func TestNoPeersNoSection(t *testing.T) {
	for _, f := range []string{FormatText, FormatMarkdown, FormatJSON, FormatHTML} {
		var buf bytes.Buffer
		if err := sampleReport().Write(&buf, f); err != nil {
			t.Fatal(err)
		}
		for _, no := range []string{peersTitle, "best peer", `"peers"`, "vs_peers"} {
			if strings.Contains(buf.String(), no) {
				t.Errorf("%s report without peers contains %q", f, no)
			}
		}
	}
}

func TestWriteMarkdownPeers(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReportPeers().WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	_, section, ok := strings.Cut(out, "### "+peersTitle+"\n\n#### redis\n\n")
	if !ok {
		t.Fatalf("markdown lacks the redis side-by-side section:\n%s", out)
	}
	var rows []string
	for _, l := range strings.Split(section, "\n") {
		if !strings.HasPrefix(l, "|") {
			break
		}
		rows = append(rows, l)
	}
	if len(rows) != 9 {
		t.Fatalf("got %d rows, want 9 (header, separator, 7 figures):\n%s", len(rows), section)
	}
	if rows[0] != "| redis | dlock | redsync | redislock | "+peerHeader+" |" {
		t.Errorf("header = %s", rows[0])
	}
	for _, r := range rows {
		if got := strings.Count(r, "|"); got != 6 {
			t.Errorf("row has %d pipes, want 6: %s", got, r)
		}
	}
	if rows[2] != "| unc p50 | 105µs (99.8µs–116µs) | 120µs | 90.0µs | 0.86× redislock |" {
		t.Errorf("unc p50 row = %s", rows[2])
	}
}

func TestWriteJSONPeers(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReportPeers().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Backends []struct {
			Peers []struct {
				Client, Module, Version, About string
				Contended                      *struct {
					OpsPerSec float64 `json:"ops_per_sec"`
				}
			}
			VsPeers map[string]struct {
				Peer  string
				Ratio float64
			} `json:"vs_peers"`
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, buf.String())
	}
	b := raw.Backends[0]
	if len(b.Peers) != 2 || b.Peers[0].Client != "redsync" || b.Peers[0].Version != "v4.18.1" || b.Peers[1].Contended.OpsPerSec != 6000 {
		t.Errorf("peers = %+v, want redsync v4.18.1 and redislock at 6000 ops/s", b.Peers)
	}
	if got := b.VsPeers["contended_ops"]; got.Peer != "redislock" || got.Ratio <= 0.83 || got.Ratio >= 0.84 {
		t.Errorf("vs_peers.contended_ops = %+v, want redislock at 0.83", got)
	}
	if len(raw.Backends[1].Peers) != 0 || raw.Backends[1].VsPeers != nil {
		t.Errorf("memory has peers in JSON: %+v", raw.Backends[1])
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if want := sampleReportPeers().Backends[0].VsPeers; !reflect.DeepEqual(back.Backends[0].VsPeers, want) {
		t.Errorf("vs_peers did not round-trip: %+v", back.Backends[0].VsPeers)
	}
}

func TestWriteHTMLPeers(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReportPeers().WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"<h2>" + peersTitle + "</h2>", "<h3>redis</h3>", "<th>" + peerHeader + "</th>", "<td>0.86× redislock</td>",
		`"client":"redsync"`, `"client":"redislock"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
}

// waitingStore is a lock table whose waiters are woken by releases: a peer
// with a native wait, for the tests.
type waitingStore struct {
	mu    sync.Mutex
	held  map[string]string
	freed chan struct{} // closed and replaced at every release
	waits atomic.Int64  // Lock calls
}

type waitingPeer struct{ s *waitingStore }

func (p waitingPeer) try(name, token string) (bool, chan struct{}) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if _, ok := p.s.held[name]; ok {
		return false, p.s.freed
	}
	p.s.held[name] = token
	return true, nil
}

func (p waitingPeer) TryLock(_ context.Context, name, token string, _ time.Duration) (bool, error) {
	ok, _ := p.try(name, token)
	return ok, nil
}

func (p waitingPeer) Lock(ctx context.Context, name, token string, _ time.Duration) error {
	p.s.waits.Add(1)
	for {
		ok, freed := p.try(name, token)
		if ok {
			return nil
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p waitingPeer) Unlock(_ context.Context, name, token string) error {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if p.s.held[name] == token {
		delete(p.s.held, name)
		close(p.s.freed)
		p.s.freed = make(chan struct{})
	}
	return nil
}

func (waitingPeer) Close() error { return nil }

func TestRunPeers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var progress bytes.Buffer
	cfg := smallConfig()
	cfg.Progress = &progress
	store := &waitingStore{held: map[string]string{}, freed: make(chan struct{})}
	target := memoryTarget()
	target.Peers = []Peer{
		{Name: "spinner", Open: MemoryFloors()}, // no Waiter: spins as the floor does
		{Name: "waiter", About: "wakes on release", Open: func(context.Context) (Floor, error) { return waitingPeer{store}, nil }},
	}
	rep, err := Run(ctx, cfg, []Target{target})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	b := rep.Backends[0]
	if len(b.Peers) != 2 || b.Peers[0].Client != "spinner" || b.Peers[1].Client != "waiter" || b.Peers[1].About != "wakes on release" {
		t.Fatalf("peers = %+v, want spinner and waiter", b.Peers)
	}
	for _, p := range b.Peers {
		if p.Uncontended == nil || p.Uncontended.N != cfg.N || p.Handoff == nil || p.Handoff.N != cfg.HandoffN ||
			p.Contended == nil || p.Contended.Ops <= 0 || p.Contended.Overlaps != 0 || p.Independent == nil || p.Independent.Ops <= 0 {
			t.Errorf("peer %s = %+v, want every scenario measured", p.Client, p)
		}
	}
	// The handoff's waiter and the contended workers wait with Lock.
	if n := store.waits.Load(); n < int64(cfg.HandoffN) {
		t.Errorf("the waiting peer's Lock was called %d times, want at least %d (one per handoff)", n, cfg.HandoffN)
	}
	vs := b.VsPeers
	if vs == nil || vs.Uncontended == nil || vs.Handoff == nil || vs.Contended == nil || vs.Independent == nil {
		t.Errorf("vs peers = %+v, want all four ratios", vs)
	}
	if got := strings.Count(progress.String(), "\n"); got != 16 {
		t.Errorf("got %d progress lines, want 16 (4 scenarios × 4 clients):\n%s", got, progress.String())
	}
}

func TestRunPeerNames(t *testing.T) {
	open := func(context.Context) (Floor, error) { return lyingFloor{}, nil }
	for _, peers := range [][]Peer{
		{{Name: "", Open: open}},
		{{Name: "floor", Open: open}},
		{{Name: "a", Open: open}, {Name: "a", Open: open}},
		{{Name: "a"}},
	} {
		target := memoryTarget()
		target.Peers = peers
		if _, err := Run(context.Background(), smallConfig(), []Target{target}); err == nil {
			t.Errorf("Run with peers %+v: no error", peers)
		}
	}
}

func TestDetached(t *testing.T) {
	var d detached
	// A wait that returns before ctx ends returns its outcome.
	if err := d.wait(context.Background(), func() error { return nil }, func() { t.Error("unlocked a lock that was taken") }); err != nil {
		t.Errorf("wait = %v, want nil", err)
	}
	boom := errors.New("boom")
	if err := d.wait(context.Background(), func() error { return boom }, nil); !errors.Is(err, boom) {
		t.Errorf("wait = %v, want boom", err)
	}
	// A wait whose ctx ends first returns at once; the lock granted later is
	// given back.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	grant, unlocked := make(chan struct{}), make(chan struct{})
	err := d.wait(ctx, func() error { <-grant; return nil }, func() { close(unlocked) })
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Errorf("wait = %v, want ErrNotAcquired and context.Canceled", err)
	}
	close(grant)
	<-unlocked
	d.idle()
	d.close()
}
