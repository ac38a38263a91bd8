package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance/faultnet"
	"github.com/dlock/dlock/fence"
)

// The faults bench (dlock bench faults): per backend and per client library
// (dlock, then each peer), Clients clients, each with its own client whose
// traffic crosses its own faultnet proxy, loop acquire → a write to a fenced
// store and to an unfenced log → hold → a second write → release, on one
// name, while a seeded nemesis breaks the clients' proxies (black holes,
// resets, latency) and, on servers started here, pauses and restarts
// servers (redlock: one node, a minority or a majority at once). Every
// believed-held interval is recorded on this process's monotonic clock, and
// the checks run over them: overlaps, writes refused or taken out of order,
// losses reported and not, recovery after the last heal, the longest time
// without a grant, acquisitions that hung past their ctx.

// Fault kinds, as counted and reported.
const (
	FaultBlackhole = "blackhole"
	FaultReset     = "reset"
	FaultLatency   = "latency"
	FaultPause     = "pause"
	FaultRestart   = "restart" // kill, then start again, as a crash would
)

// FaultKinds lists the kinds in the order the report shows them.
var FaultKinds = []string{FaultBlackhole, FaultReset, FaultLatency, FaultPause, FaultRestart}

// faultLetter is each kind's letter in the table's faults column.
var faultLetter = map[string]string{FaultBlackhole: "b", FaultReset: "r", FaultLatency: "l", FaultPause: "p", FaultRestart: "R"}

// Defaults of FaultsConfig.
const (
	DefaultFaultsClients  = 4
	DefaultFaultsDuration = 20 * time.Second
	DefaultFaultsHold     = 5 * time.Millisecond
	DefaultFaultsTTL      = 2 * time.Second
	DefaultFaultsLong     = 0.1
)

// hangGrace is how long past its ctx's deadline an acquisition may return
// before it counts as hung.
const hangGrace = time.Second

// stopBound bounds waiting for a client's goroutine to stop once the run's
// ctx has ended (and again once its proxies were reset).
const stopBound = 30 * time.Second

// maxFaultSteps bounds the schedule of one path or server.
const maxFaultSteps = 10000

// FaultsConfig sizes a faults run.
type FaultsConfig struct {
	Clients  int           // clients per library; default 4 (2 in Sanity mode)
	Duration time.Duration // the fault phase; default 20s
	Hold     time.Duration // a usual hold; default 5ms
	TTL      time.Duration // the locks' TTL, or the backend's minimum if longer; default 2s
	// Long is the fraction of holds that last 1.5×TTL, so that the lock
	// must be kept alive through faults (a peer with no refresh loop of
	// its own believes it holds the lock only to the TTL, and stops
	// writing then). 0 or less: none; the command's default is
	// DefaultFaultsLong.
	Long float64
	// Seed makes the nemesis's schedule and the clients' choices; the same
	// seed replays the same schedule (the timing of the run still varies).
	Seed uint64
	// Sanity runs the harness on locks that do not exclude each other:
	// each client locks a name of its own (and, on memory, a store of its
	// own, as the target's Via gives). Overlaps must show; peers are not run.
	Sanity   bool
	Progress io.Writer
}

func (c FaultsConfig) withDefaults() FaultsConfig {
	if c.Clients <= 0 {
		c.Clients = DefaultFaultsClients
		if c.Sanity {
			c.Clients = 2
		}
	}
	if c.Duration <= 0 {
		c.Duration = DefaultFaultsDuration
	}
	if c.Hold <= 0 {
		c.Hold = DefaultFaultsHold
	}
	if c.TTL <= 0 {
		c.TTL = DefaultFaultsTTL
	}
	return c
}

// ServerControl is a server the bench may pause (docker pause), resume and
// restart (kill, then start again): *dlocktest.Server for the servers it
// started.
type ServerControl interface {
	Pause(ctx context.Context) error
	Unpause(ctx context.Context) error
	Restart(ctx context.Context) error
	String() string
}

// FaultsTarget is one backend under the faults bench.
type FaultsTarget struct {
	Backend string
	URL     string // redacted, for the report
	// Addrs are the servers' host:port; each client reaches them through
	// proxies of its own. None for an in-process backend (no path faults).
	Addrs []string
	// Via returns the URL by which client reaches the servers at addrs
	// (its proxies, in the order of Addrs).
	Via func(client int, addrs []string) string
	// Servers, when the bench started them, may be paused and restarted
	// (redlock: one node, a minority or a majority at once). Nil: no
	// server faults.
	Servers []ServerControl
	// Peers returns the peers on the backend at a URL that Via made; nil
	// when the backend has none or -peers is off.
	Peers func(raw string) ([]Peer, error)
}

// FaultsRow is one library's figures on one backend. Durations are in
// nanoseconds; -1 means none (never happened, or not measurable).
type FaultsRow struct {
	Backend string `json:"backend"`
	Library string `json:"library"`
	Version string `json:"version,omitempty"`
	// About is the library's configuration in this run.
	About   string `json:"about"`
	URL     string `json:"url"`
	Clients int    `json:"clients"`
	// TTL is the locks' TTL: the configured one, or the backend's minimum.
	TTL time.Duration `json:"ttl_ns"`
	// Faults counts the faults injected, by kind; FaultsRan says which
	// kinds could run, and why not the others.
	Faults    map[string]int `json:"faults"`
	FaultsRan string         `json:"faults_ran"`

	Grants int `json:"grants"`
	// Overlaps counts pairs of believed-held intervals of two clients that
	// overlap in time; Excused, those a documented hazard of the backend
	// allows (dlock rows only), Why lists the hazards. LongestOverlap is
	// the longest of the others.
	Overlaps       int            `json:"overlaps"`
	Excused        int            `json:"overlaps_excused"`
	Why            map[string]int `json:"excused_by,omitempty"`
	LongestOverlap time.Duration  `json:"longest_overlap_ns"`
	// Fenced: the leases carry fencing tokens, written to the fenced
	// store; FencedRefused counts the writes it refused.
	Fenced        bool `json:"fenced"`
	FencedRefused int  `json:"fenced_refused"`
	// OutOfOrder counts the writes the unfenced log took from a holder
	// granted before another that had already written.
	OutOfOrder int `json:"unfenced_out_of_order"`
	// LossesReported are leases whose library signalled their loss while
	// the holder held them; LossesUnreported, leases shown gone while
	// believed held with no signal (overlapped by another client's grant,
	// or a write of theirs refused). UnreportedFor is the longest time
	// such a holder kept working after another was granted (-1: none).
	LossesReported   int           `json:"losses_reported"`
	LossesUnreported int           `json:"losses_unreported"`
	UnreportedFor    time.Duration `json:"unreported_for_ns"`
	// ReleaseNotHeld counts releases, made while the lease was believed
	// held and with no loss signalled, that found the lock gone. It is no
	// proof of a loss while held: a release delayed on its way may arrive
	// after the lock expired.
	ReleaseNotHeld int `json:"release_not_held"`
	// LossReportP50/P99 are the loss reports' latencies after the lease's
	// real end as this process sees it: the earlier of its last validity
	// deadline and the next grant to another client. Negative: reported
	// while the lock was surely still held. -1 with no samples.
	LossReportN   int           `json:"loss_report_samples"`
	LossReportP50 time.Duration `json:"loss_report_p50_ns"`
	LossReportP99 time.Duration `json:"loss_report_p99_ns"`
	// Recovery is the time from the last heal to the next grant;
	// RecoveryAll, to every client's next grant. -1: no fault ran, or a
	// client was not granted within RecoveryBound.
	Recovery      time.Duration `json:"recovery_ns"`
	RecoveryAll   time.Duration `json:"recovery_all_ns"`
	RecoveryBound time.Duration `json:"recovery_bound_ns"`
	// LongestGap is the longest time without any grant, from the start to
	// the end of the run.
	LongestGap time.Duration `json:"longest_gap_ns"`
	// Hung counts acquisitions that returned more than a second after
	// their ctx's deadline.
	Hung int `json:"hung"`
	// AcquireErrors counts failed acquisitions by class (a ctx's deadline
	// in a contended wait is "not acquired").
	AcquireErrors map[string]int `json:"acquire_errors,omitempty"`
	ReleaseErrors map[string]int `json:"release_errors,omitempty"`
	// Errors are the harness's own failures (a client that could not be
	// opened, a server that could not be paused).
	Errors []string `json:"errors,omitempty"`
	// Timeline is what happened when, for the HTML report's timeline.
	Timeline *FaultsTimeline `json:"timeline,omitempty"`
}

// FaultsTimeline is a run as it happened, in milliseconds from its start
// on this process's monotonic clock.
type FaultsTimeline struct {
	Phase float64 `json:"phase_ms"` // the fault phase's end
	End   float64 `json:"end_ms"`   // the run's end
	// Held are the believed-held intervals; Kind is how each ended:
	// "release", "loss" (its library's signal) or "validity" (its deadline
	// passed first).
	Held []TimelineSpan `json:"held"`
	// Faults are the fault windows; Client -1 is a server fault, Kind the
	// fault's kind.
	Faults []TimelineSpan `json:"faults"`
	// Overlaps are the overlapping stretches of two clients' intervals:
	// Client held first, Other was granted during it; Kind is "overlap",
	// or "excused" when a documented hazard allows it.
	Overlaps []TimelineSpan `json:"overlaps,omitempty"`
}

// TimelineSpan is one interval of a FaultsTimeline.
type TimelineSpan struct {
	Client int     `json:"client"`
	Other  int     `json:"other,omitempty"`
	From   float64 `json:"from_ms"`
	To     float64 `json:"to_ms"`
	Kind   string  `json:"kind"`
	Note   string  `json:"note,omitempty"` // a server fault's servers
}

// FaultsReport is a faults run.
type FaultsReport struct {
	Seed     uint64        `json:"seed"`
	Clients  int           `json:"clients"`
	Duration time.Duration `json:"duration_ns"`
	Hold     time.Duration `json:"hold_ns"`
	TTL      time.Duration `json:"ttl_ns"`
	Long     float64       `json:"long_holds"`
	Sanity   bool          `json:"sanity"`
	Rows     []FaultsRow   `json:"rows"`
	Notes    []string      `json:"notes"`
}

// RunFaults runs every target: dlock, then each peer (unless Sanity).
func RunFaults(ctx context.Context, cfg FaultsConfig, targets []FaultsTarget) *FaultsReport {
	cfg = cfg.withDefaults()
	rep := &FaultsReport{Seed: cfg.Seed, Clients: cfg.Clients, Duration: cfg.Duration, Hold: cfg.Hold, TTL: cfg.TTL,
		Long: max(cfg.Long, 0), Sanity: cfg.Sanity, Notes: faultsNotes}
	run := runID()
	for _, t := range targets {
		if ctx.Err() != nil {
			break
		}
		libs := []faultsLib{dlockLib()}
		var peerErr error
		if t.Peers != nil && !cfg.Sanity {
			// The peers' names and configuration, from a URL with the
			// servers' own addresses (the clients' differ only in hosts).
			peers, err := t.Peers(t.Via(0, t.Addrs))
			if err != nil {
				peerErr = err
			}
			for _, p := range peers {
				libs = append(libs, peerLib(t, p))
			}
		}
		ttl := cfg.TTL // dlock's, raised to the backend's minimum: the peers' too
		for _, lib := range libs {
			if ctx.Err() != nil {
				break
			}
			row := faultsOnce(ctx, cfg, t, lib, run, ttl)
			if lib.dlock && row.TTL > 0 {
				ttl = row.TTL
			}
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "%-9s %-18s %s\n", t.Backend, lib.name, row.summary())
				for _, e := range row.Errors {
					fmt.Fprintf(cfg.Progress, "%-9s %-18s ERROR %s\n", t.Backend, lib.name, e)
				}
			}
			rep.Rows = append(rep.Rows, row)
		}
		if peerErr != nil {
			rep.Rows = append(rep.Rows, FaultsRow{Backend: t.Backend, Library: "peers", URL: t.URL,
				Errors: []string{peerErr.Error()}})
		}
	}
	return rep
}

// faultsLib is a client library under test.
type faultsLib struct {
	name, version, about string
	// dlock: the rows that may excuse overlaps by the backend's declared
	// hazards.
	dlock bool
	open  func(ctx context.Context, raw string) (faultsClient, error)
}

// faultsClient is one client of a library: one dlock Locker, or one peer's
// client, used by one goroutine.
type faultsClient interface {
	// ttl returns the TTL the client's locks get: ttl, or the backend's
	// minimum if longer.
	ttl(ttl time.Duration) time.Duration
	// acquire waits for name until ctx ends.
	acquire(ctx context.Context, name string, ttl time.Duration) (faultsGrant, error)
	close() error
}

// faultsGrant is one held lock.
type faultsGrant interface {
	// fence returns the fencing token, if the library makes them.
	fence() (uint64, bool)
	// lost is closed when the library reports the lock lost (nil: the
	// library has no such signal). It may also close at release.
	lost() <-chan struct{}
	// validUntil is when the holder must stop believing it holds the lock
	// by its library's own account; zero when the library keeps it alive
	// (a session) rather than by a deadline.
	validUntil() time.Time
	// release gives the lock back, reporting whether the library found it
	// already gone.
	release(ctx context.Context) (notHeld bool, err error)
}

// dlockLib is dlock, through the driver of the target's URL.
func dlockLib() faultsLib {
	return faultsLib{
		name: "dlock", version: dlockVersion(), dlock: true,
		about: "dlock.Open per client; Acquire (ctx bounded), the watchdog refreshing, Lease.Done as the loss signal, Release",
		open: func(ctx context.Context, raw string) (faultsClient, error) {
			l, err := dlock.Open(ctx, raw)
			if err != nil {
				return nil, err
			}
			return &dlockFaultsClient{l: l}, nil
		},
	}
}

type dlockFaultsClient struct{ l *dlock.Locker }

func (c *dlockFaultsClient) ttl(ttl time.Duration) time.Duration {
	return max(ttl, c.l.Capabilities().MinTTL)
}

func (c *dlockFaultsClient) acquire(ctx context.Context, name string, ttl time.Duration) (faultsGrant, error) {
	ls, err := c.l.Acquire(ctx, name, &dlock.Options{TTL: ttl})
	if err != nil {
		return nil, err
	}
	return dlockFaultsGrant{ls}, nil
}

func (c *dlockFaultsClient) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	return c.l.Close(ctx)
}

type dlockFaultsGrant struct{ ls *dlock.Lease }

func (g dlockFaultsGrant) fence() (uint64, bool) { return g.ls.Fence() }
func (g dlockFaultsGrant) lost() <-chan struct{} { return g.ls.Done() }
func (g dlockFaultsGrant) validUntil() time.Time { return g.ls.ValidUntil() }
func (g dlockFaultsGrant) release(ctx context.Context) (bool, error) {
	err := g.ls.Release(ctx)
	return errors.Is(err, dlock.ErrNotHeld), err
}

// peerLib is peer p on t. Its clients are opened from the URL Via makes,
// so that they too cross their own proxies.
func peerLib(t FaultsTarget, p Peer) faultsLib {
	// Without a refresh loop of its own, the holder believes it holds the
	// lock until the TTL from its call.
	refreshes := p.Name != "redsync" && p.Name != "redislock"
	about := p.About
	if !refreshes {
		about += "; no refresh loop: the lock is believed held until the TTL from the Lock call, so a long hold stops writing then"
	}
	return faultsLib{
		name: p.Name, version: moduleVersion(p.Module), about: about,
		open: func(ctx context.Context, raw string) (faultsClient, error) {
			peers, err := t.Peers(raw)
			if err != nil {
				return nil, err
			}
			i := slices.IndexFunc(peers, func(q Peer) bool { return q.Name == p.Name })
			if i < 0 {
				return nil, fmt.Errorf("bench: peer %s not offered for %s", p.Name, t.Backend)
			}
			c := &peerFaultsClient{open: peers[i].Open, prefix: runID() + ":", keepsAlive: refreshes}
			if err := c.reopen(ctx); err != nil {
				return nil, err
			}
			return c, nil
		},
	}
}

// peerFaultsClient drives one peer client as an application would: its
// own wait (Waiter) or a retry every PeerRetryDelay, and a new client after
// one failed (a pgx connection or an etcd session does not come back).
type peerFaultsClient struct {
	open       FloorOpener
	f          Floor
	broken     bool
	prefix     string
	seq        int
	keepsAlive bool
}

func (c *peerFaultsClient) reopen(ctx context.Context) error {
	if c.f != nil {
		_ = c.f.Close()
		c.f = nil
	}
	f, err := c.open(ctx)
	if err != nil {
		return err
	}
	c.f, c.broken = f, false
	return nil
}

func (c *peerFaultsClient) ttl(ttl time.Duration) time.Duration { return ttl }

func (c *peerFaultsClient) acquire(ctx context.Context, name string, ttl time.Duration) (faultsGrant, error) {
	if ep, ok := c.f.(*etcdPeer); ok && ep.s != nil {
		select {
		case <-ep.s.Done(): // the session's lease is gone: a new client
			c.broken = true
		default:
		}
	}
	if c.broken || c.f == nil {
		if err := c.reopen(ctx); err != nil {
			return nil, err
		}
	}
	c.seq++
	token := fmt.Sprintf("%s%d", c.prefix, c.seq)
	call := time.Now()
	err := c.lock(ctx, name, token, ttl)
	if err != nil {
		if ctx.Err() == nil {
			c.broken = true
		}
		return nil, err
	}
	g := &peerFaultsGrant{c: c, name: name, token: token}
	if !c.keepsAlive {
		g.until = call.Add(ttl)
	}
	if ep, ok := c.f.(*etcdPeer); ok && ep.s != nil {
		g.done = ep.s.Done()
	}
	return g, nil
}

func (c *peerFaultsClient) lock(ctx context.Context, name, token string, ttl time.Duration) error {
	if w, ok := c.f.(Waiter); ok {
		return w.Lock(ctx, name, token, ttl)
	}
	for {
		ok, err := c.f.TryLock(ctx, name, token, ttl)
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		}
		t := time.NewTimer(PeerRetryDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return errors.Join(dlock.ErrNotAcquired, ctx.Err())
		}
	}
}

func (c *peerFaultsClient) close() error {
	if c.f == nil {
		return nil
	}
	return c.f.Close()
}

type peerFaultsGrant struct {
	c           *peerFaultsClient
	name, token string
	until       time.Time
	done        <-chan struct{}
}

func (g *peerFaultsGrant) fence() (uint64, bool) { return 0, false }
func (g *peerFaultsGrant) lost() <-chan struct{} { return g.done }
func (g *peerFaultsGrant) validUntil() time.Time { return g.until }
func (g *peerFaultsGrant) release(ctx context.Context) (bool, error) {
	err := g.c.f.Unlock(ctx, g.name, g.token)
	// redislock.ErrLockNotHeld; redsync's "not held on a majority".
	return err != nil && strings.Contains(err.Error(), "not held"), err
}

// faultStep is one fault of the schedule.
type faultStep struct {
	At      time.Duration // from the run's start
	Client  int           // -1: servers
	Nodes   []int         // the servers paused or restarted
	Kind    string
	For     time.Duration // the window; 0 for a reset
	Latency time.Duration
}

// between returns a random duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// faultSchedule is the nemesis's schedule for the paths of clients and for
// pausable servers over d: per path, a fault every TTL/4–2×TTL (a black
// hole of TTL/4–3×TTL, a reset, or TTL/50–TTL/3 of latency for TTL/2–3×TTL);
// per run, a server fault every TTL–4×TTL: a pause of TTL/4–3×TTL (7 in
// 10) or a restart, of one server, or with several servers (redlock) of one
// (half the time), a minority or a majority. Every window ends by d. The
// same seed gives the same schedule.
func faultSchedule(seed uint64, clients, servers int, d, ttl time.Duration) [][]faultStep {
	out := make([][]faultStep, clients+1) // the last: the servers
	for i := range clients {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		for t := between(rng, ttl/4, 2*ttl); t < d && len(out[i]) < maxFaultSteps; t += between(rng, ttl/4, 2*ttl) {
			s := faultStep{At: t, Client: i}
			switch n := rng.IntN(10); {
			case n < 4:
				s.Kind, s.For = FaultBlackhole, between(rng, ttl/4, 3*ttl)
			case n < 7:
				s.Kind = FaultReset
			default:
				s.Kind, s.Latency, s.For = FaultLatency, between(rng, ttl/50, ttl/3), between(rng, ttl/2, 3*ttl)
			}
			s.For = min(s.For, d-t)
			out[i] = append(out[i], s)
			t += s.For
		}
	}
	if servers > 0 {
		rng := rand.New(rand.NewPCG(seed, 1000))
		for t := between(rng, ttl, 4*ttl); t < d && len(out[clients]) < maxFaultSteps; t += between(rng, ttl, 4*ttl) {
			s := faultStep{At: t, Client: -1, Kind: FaultPause, For: min(between(rng, ttl/4, 3*ttl), d-t)}
			if rng.IntN(10) >= 7 {
				s.Kind, s.For = FaultRestart, 0
			}
			n := 1
			if servers > 1 {
				switch rng.IntN(4) {
				case 2:
					n = max((servers-1)/2, 1) // a minority
				case 3:
					n = servers/2 + 1 // a majority
				}
			}
			s.Nodes = rng.Perm(servers)[:n]
			slices.Sort(s.Nodes)
			out[clients] = append(out[clients], s)
			t += s.For
		}
	}
	return out
}

// faultsLease is one grant as its holder saw it, on the monotonic clock.
type faultsLease struct {
	client int
	seq    int       // order of the grants' return
	call   time.Time // acquire called
	grant  time.Time // acquire returned
	// end is when the holder stopped believing it held the lock: the
	// earliest of the release call, the loss signal as seen, and its
	// validity deadline.
	end        time.Time
	ended      string    // "release", "loss", "validity"
	reported   time.Time // the loss signal seen while held; zero if none
	validUntil time.Time // its last validity deadline; zero if unknown
	notHeld    bool      // release found the lock gone, with no signal before (not a proof of loss)
	refused    bool      // a write of it was refused by the fenced store
}

// faultWindow is a fault as it ran.
type faultWindow struct {
	client   int // -1: servers
	kind     string
	from, to time.Time
	note     string // the servers hit
}

// faultsRun is one library's run on one backend.
type faultsRun struct {
	cfg    FaultsConfig
	lib    faultsLib
	name   string
	ttl    time.Duration
	epoch  time.Time
	phase  time.Time // the end of the fault phase
	caps   dlock.Capabilities
	store  fence.Memory
	row    *FaultsRow
	stopAt []chan struct{} // per client: closed once it has been granted after cut

	mu      sync.Mutex
	leases  []*faultsLease
	windows []faultWindow
	logMax  int // the unfenced log's newest writer, by grant order
	seq     int
	// cut is when the fault phase ended and every fault was healed; zero
	// before. Each client stops after its first grant after it.
	cut time.Time
}

func (r *faultsRun) nameFor(client int) string {
	if r.cfg.Sanity {
		return fmt.Sprintf("%s:sanity-%d", r.name, client)
	}
	return r.name
}

// faultsOnce runs lib on t, its locks' TTL ttl or the backend's minimum.
func faultsOnce(ctx context.Context, cfg FaultsConfig, t FaultsTarget, lib faultsLib, run string, ttl time.Duration) (row FaultsRow) {
	row = FaultsRow{
		Backend: t.Backend, Library: lib.name, Version: lib.version, About: lib.about, URL: t.URL,
		Clients: cfg.Clients, Faults: map[string]int{}, AcquireErrors: map[string]int{}, ReleaseErrors: map[string]int{},
		Fenced: true, Recovery: -1, RecoveryAll: -1, UnreportedFor: -1, LossReportP50: -1, LossReportP99: -1,
	}
	ran := []string{}
	if len(t.Addrs) > 0 {
		ran = append(ran, "blackhole, reset and latency on each client's proxies")
	} else {
		ran = append(ran, "no path faults (in-process backend)")
	}
	switch {
	case len(t.Servers) > 1:
		ran = append(ran, "pause and restart of one server, a minority or a majority")
	case len(t.Servers) == 1:
		ran = append(ran, "pause and restart of the server")
	case len(t.Addrs) > 0:
		ran = append(ran, "no server pause or restart (a server not started here)")
	}
	row.FaultsRan = strings.Join(ran, "; ")

	// The clients, each behind proxies of its own.
	var proxies [][]*faultnet.Proxy
	var clients []faultsClient
	defer func() {
		for _, c := range clients {
			if err := c.close(); err != nil {
				row.Errors = append(row.Errors, fmt.Sprintf("closing a client: %v", err))
			}
		}
		for _, ps := range proxies {
			for _, p := range ps {
				_ = p.Close()
			}
		}
	}()
	r := &faultsRun{cfg: cfg, lib: lib, name: fmt.Sprintf("dlock-bench:%s:faults:%s", run, lib.name), ttl: ttl, row: &row}
	for i := range cfg.Clients {
		var ps []*faultnet.Proxy
		addrs := make([]string, 0, len(t.Addrs))
		for _, a := range t.Addrs {
			p, err := faultnet.Listen(a)
			if err != nil {
				row.Errors = append(row.Errors, err.Error())
				return row
			}
			ps = append(ps, p)
			addrs = append(addrs, p.Addr())
		}
		proxies = append(proxies, ps)
		octx, cancel := context.WithTimeout(ctx, closeTimeout)
		c, err := lib.open(octx, t.Via(i, addrs))
		cancel()
		if err != nil {
			row.Errors = append(row.Errors, fmt.Sprintf("client %d: %v", i, err))
			return row
		}
		clients = append(clients, c)
		r.ttl = c.ttl(ttl)
		if dc, ok := c.(*dlockFaultsClient); ok {
			r.caps = dc.l.Capabilities()
			row.Fenced = r.caps.Fencing
		} else {
			row.Fenced = false
		}
	}
	row.TTL = r.ttl
	slack := r.ttl + r.caps.ExpirySlack
	row.RecoveryBound = 10*time.Second + time.Duration(2*cfg.Clients+4)*slack
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "%-9s %-18s %d clients for %v (TTL %v), seed %d…\n", t.Backend, lib.name, cfg.Clients, cfg.Duration, r.ttl, cfg.Seed)
	}

	schedule := faultSchedule(cfg.Seed, cfg.Clients, len(t.Servers), cfg.Duration, r.ttl)
	if len(t.Addrs) == 0 {
		for i := range cfg.Clients {
			schedule[i] = nil
		}
	}
	r.epoch = time.Now()
	r.phase = r.epoch.Add(cfg.Duration)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	r.stopAt = make([]chan struct{}, cfg.Clients)
	stopped := make([]chan struct{}, cfg.Clients)
	for i, c := range clients {
		r.stopAt[i], stopped[i] = make(chan struct{}), make(chan struct{})
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(500+i)))
		go func() {
			defer close(stopped[i])
			r.client(runCtx, i, c, rng)
		}()
	}
	var nemesis sync.WaitGroup
	for i := range cfg.Clients {
		nemesis.Go(func() { r.pathNemesis(runCtx, i, proxies[i], schedule[i]) })
	}
	if len(t.Servers) > 0 {
		nemesis.Go(func() { r.serverNemesis(runCtx, t.Servers, schedule[cfg.Clients]) })
	}
	nemesis.Wait() // each heals what it broke before returning

	// The fault phase lasts Duration; then each client takes the lock once
	// more and stops, within the recovery bound.
	phase := time.NewTimer(time.Until(r.phase))
	select {
	case <-phase.C:
	case <-ctx.Done():
	}
	phase.Stop()
	r.mu.Lock()
	r.cut = time.Now()
	r.mu.Unlock()
	bound := time.NewTimer(row.RecoveryBound)
	defer bound.Stop()
wait:
	for _, ch := range r.stopAt {
		select {
		case <-ch:
		case <-bound.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	stop()
	end := time.Now()
	if !waitAll(stopped, stopBound) {
		// A call that ignores its ctx: reset its connections.
		for _, ps := range proxies {
			for _, p := range ps {
				p.Reset()
			}
		}
		if !waitAll(stopped, stopBound) {
			row.Errors = append(row.Errors, fmt.Sprintf("a client did not stop within %v of the run's end, its connections reset", 2*stopBound))
		}
	}
	r.check(end)
	return row
}

// waitAll waits for every channel to close, up to d; it reports whether
// they all did.
func waitAll(chs []chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, ch := range chs {
		select {
		case <-ch:
		case <-t.C:
			return false
		}
	}
	return true
}

// sleepCtx sleeps for d or until ctx ends, reporting whether it slept
// through.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *faultsRun) count(kind string, client int, from, to time.Time) {
	r.countNote(kind, client, from, to, "")
}

// countNote is count, with what the fault hit (the servers).
func (r *faultsRun) countNote(kind string, client int, from, to time.Time, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.row.Faults[kind]++
	r.windows = append(r.windows, faultWindow{client: client, kind: kind, from: from, to: to, note: note})
}

// pathNemesis runs client i's schedule on its proxies and leaves them
// healed.
func (r *faultsRun) pathNemesis(ctx context.Context, i int, ps []*faultnet.Proxy, steps []faultStep) {
	for _, s := range steps {
		if !sleepCtx(ctx, time.Until(r.epoch.Add(s.At))) {
			return
		}
		from := time.Now()
		switch s.Kind {
		case FaultBlackhole:
			for _, p := range ps {
				p.Blackhole()
			}
			sleepCtx(ctx, s.For)
			for _, p := range ps {
				p.Heal() // resets the connections that lost bytes
			}
		case FaultReset:
			for _, p := range ps {
				p.Reset()
			}
		case FaultLatency:
			for _, p := range ps {
				p.SetLatency(s.Latency)
			}
			sleepCtx(ctx, s.For)
			for _, p := range ps {
				p.SetLatency(0)
			}
		}
		r.count(s.Kind, i, from, time.Now())
	}
}

// serverNemesis pauses and restarts servers by the schedule and leaves
// them running. A pause, resume or restart that fails (a restart is tried
// twice) ends the server faults, reported as the harness's error.
func (r *faultsRun) serverNemesis(ctx context.Context, srvs []ServerControl, steps []faultStep) {
	for _, s := range steps {
		if !sleepCtx(ctx, time.Until(r.epoch.Add(s.At))) {
			return
		}
		group := make([]ServerControl, len(s.Nodes))
		for i, n := range s.Nodes {
			group[i] = srvs[n]
		}
		what := serversText(s.Nodes, len(srvs))
		from := time.Now()
		if s.Kind == FaultRestart {
			err := onEach(group, func(srv ServerControl, c context.Context) error {
				if err := srv.Restart(c); err != nil {
					// Once more: on a loaded machine a restarted container
					// has been seen not to answer within a minute, and to
					// come up when started again.
					return srv.Restart(c)
				}
				return nil
			})
			r.countNote(FaultRestart, -1, from, time.Now(), what)
			if err != nil {
				r.harnessError(fmt.Sprintf("restarting %s: %v (no more server faults)", what, err))
				return
			}
			continue
		}
		if err := onEach(group, ServerControl.Pause); err != nil {
			r.harnessError(fmt.Sprintf("pausing %s: %v (no more server faults)", what, err))
			_ = onEach(group, ServerControl.Unpause) // some may have been paused all the same
			return
		}
		from = time.Now()
		sleepCtx(ctx, s.For)
		err := onEach(group, ServerControl.Unpause)
		r.countNote(FaultPause, -1, from, time.Now(), what)
		if err != nil {
			r.harnessError(fmt.Sprintf("resuming %s: %v (it may still be paused)", what, err))
			return
		}
	}
}

// onEach runs do on every server at once, each bounded by two minutes.
func onEach(srvs []ServerControl, do func(ServerControl, context.Context) error) error {
	errs := make([]error, len(srvs))
	var wg sync.WaitGroup
	for i, srv := range srvs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := do(srv, ctx); err != nil {
				errs[i] = fmt.Errorf("%s: %w", srv, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// serversText names the servers of a fault: "the server", or the nodes and
// whether they are a minority or a majority of n.
func serversText(nodes []int, n int) string {
	if n == 1 {
		return "the server"
	}
	ids := make([]string, len(nodes))
	for i, x := range nodes {
		ids[i] = fmt.Sprint(x)
	}
	share := "a minority"
	if 2*len(nodes) > n {
		share = "a majority"
	}
	return fmt.Sprintf("node %s of %d (%s)", strings.Join(ids, ","), n, share)
}

func (r *faultsRun) harnessError(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.row.Errors = append(r.row.Errors, msg)
}

// write is one write of l to the protected resource: the unfenced log takes
// it, out of order when a later grant has already written; the fenced store
// takes it only if no higher token has written.
func (r *faultsRun) write(l *faultsLease, token uint64, fenced bool) {
	r.mu.Lock()
	if l.seq < r.logMax {
		r.row.OutOfOrder++
	} else {
		r.logMax = l.seq
	}
	r.mu.Unlock()
	if !fenced {
		return
	}
	if err := r.store.Write("resource", token, func() error { return nil }); errors.Is(err, fence.ErrStale) {
		r.mu.Lock()
		r.row.FencedRefused++
		l.refused = true
		r.mu.Unlock()
	}
}

// client loops acquire → write → hold → write → release on the run's name
// until ctx ends, or, once the fault phase is over and healed, until it has
// been granted once.
func (r *faultsRun) client(ctx context.Context, i int, c faultsClient, rng *rand.Rand) {
	ttl := r.ttl
	name := r.nameFor(i)
	long := ttl + ttl/2
	for n := 0; ctx.Err() == nil && n < 1_000_000; n++ {
		call := time.Now()
		actx, cancel := context.WithTimeout(ctx, 2*ttl)
		deadline, _ := actx.Deadline()
		g, err := c.acquire(actx, name, ttl)
		ret := time.Now()
		cancel()
		if ret.Sub(deadline) > hangGrace {
			r.mu.Lock()
			r.row.Hung++
			r.mu.Unlock()
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			r.row.AcquireErrors[faultsErrorClass(err)]++
			r.mu.Unlock()
			if !errors.Is(err, context.DeadlineExceeded) && !sleepCtx(ctx, between(rng, ttl/50, ttl/5)) {
				return // it failed fast: back off before the next try
			}
			continue
		}
		token, fenced := g.fence()
		r.mu.Lock()
		l := &faultsLease{client: i, seq: r.seq, call: call, grant: ret}
		r.seq++
		r.leases = append(r.leases, l)
		r.mu.Unlock()
		lost := g.lost()
		signalled := func() bool {
			select {
			case <-lost: // a nil channel never is
				return true
			default:
				return false
			}
		}
		// The holder writes while it believes it holds the lock, as the
		// library tells it: no loss signalled, its validity not passed.
		believed := func() bool {
			vu := g.validUntil()
			return !signalled() && (vu.IsZero() || time.Now().Before(vu))
		}
		if believed() {
			r.write(l, token, fenced)
		}
		hold := r.cfg.Hold
		if rng.Float64() < r.cfg.Long {
			hold = long
		}
		var lossSeen time.Time
		t := time.NewTimer(hold)
		select {
		case <-lost:
			lossSeen = time.Now()
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		holdEnd := time.Now()
		if lossSeen.IsZero() && believed() {
			r.write(l, token, fenced)
		}
		relAt := time.Now()
		if lossSeen.IsZero() && signalled() {
			lossSeen = holdEnd // lost at a moment not seen, surely before
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 2*ttl)
		notHeld, rerr := g.release(rctx)
		rcancel()
		vu := g.validUntil()
		r.mu.Lock()
		switch {
		case !lossSeen.IsZero() && (vu.IsZero() || lossSeen.Before(vu)):
			l.end, l.ended = lossSeen, "loss"
		case !vu.IsZero() && (!lossSeen.IsZero() || !relAt.Before(vu)):
			l.end, l.ended = vu, "validity"
		default:
			l.end, l.ended = relAt, "release"
		}
		l.validUntil = vu
		if !lossSeen.IsZero() {
			l.reported = lossSeen
		}
		l.notHeld = notHeld && lossSeen.IsZero() && l.ended == "release"
		if rerr != nil && !notHeld {
			r.row.ReleaseErrors[faultsErrorClass(rerr)]++
		}
		cut := r.cut
		r.mu.Unlock()
		if !cut.IsZero() && ret.After(cut) {
			close(r.stopAt[i])
			return
		}
	}
}

// faultsErrorClass names an error for the counts: its last part, digits
// removed, shortened.
func faultsErrorClass(err error) string {
	switch {
	case errors.Is(err, dlock.ErrNotAcquired) && errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.DeadlineExceeded):
		return "not acquired"
	case errors.Is(err, dlock.ErrNotHeld):
		return "not held"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	msg = strings.Map(func(c rune) rune {
		if c >= '0' && c <= '9' {
			return -1
		}
		return c
	}, msg)
	if len(msg) > 50 {
		msg = msg[:50]
	}
	return msg
}

// excused says which documented hazard of the backend allows a's
// believed interval to overlap b's grant, or "": a server restart while a
// held the lock and before b was granted, on a backend that does not
// declare SurvivesRestart (or is ConnectionBound); with ConnectionBound, a
// reset of a's path (or a heal, which resets the connections that lost
// bytes) in that time. Only dlock rows declare hazards.
func (r *faultsRun) excused(a, b *faultsLease) string {
	if !r.lib.dlock {
		return ""
	}
	if !r.caps.SurvivesRestart || r.caps.ConnectionBound {
		for _, w := range r.windows {
			// A restart that began while a held the lock, before b's grant.
			if w.kind == FaultRestart && w.from.After(a.call) && w.from.Before(a.end) && w.from.Before(b.grant) {
				return "restart of a backend that does not keep locks across one (SurvivesRestart not declared)"
			}
		}
	}
	if !r.caps.ConnectionBound {
		return ""
	}
	for _, w := range r.windows {
		if w.client != a.client || (w.kind != FaultReset && w.kind != FaultBlackhole) {
			continue
		}
		// A reset acts at once; a black hole's heal resets at its end.
		at := w.to
		if w.kind == FaultReset {
			at = w.from
		}
		if at.After(a.call) && at.Before(a.end) && at.Before(b.grant) {
			return "ConnectionBound: the holder's connection was reset (" + w.kind + ")"
		}
	}
	return ""
}

// earlier is the earlier of a and b.
func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// ms is t in milliseconds from the run's start.
func (r *faultsRun) ms(t time.Time) float64 {
	return float64(t.Sub(r.epoch)) / float64(time.Millisecond)
}

// span is an interval of the timeline.
func (r *faultsRun) span(client, other int, from, to time.Time, kind string) TimelineSpan {
	return TimelineSpan{Client: client, Other: other, From: r.ms(from), To: max(r.ms(to), r.ms(from)), Kind: kind}
}

// check computes the row's figures from what the run recorded.
func (r *faultsRun) check(end time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	row := r.row
	row.Grants = len(r.leases)
	byGrant := slices.Clone(r.leases)
	slices.SortFunc(byGrant, func(a, b *faultsLease) int { return a.grant.Compare(b.grant) })
	tl := &FaultsTimeline{Phase: r.ms(r.phase), End: r.ms(end)}
	row.Timeline = tl
	for _, l := range byGrant {
		tl.Held = append(tl.Held, r.span(l.client, 0, l.grant, earlier(l.end, end), l.ended))
	}
	for _, w := range r.windows {
		sp := r.span(w.client, 0, w.from, w.to, w.kind)
		sp.Note = w.note
		tl.Faults = append(tl.Faults, sp)
	}

	// Overlaps: each lease against the earlier ones whose belief still runs
	// at its grant; and for each, the first grant of another client after
	// its own (the latest its lock can have ended, for the loss reports).
	gone := map[*faultsLease]time.Duration{} // believed past another's grant, by how long
	nextOther := map[*faultsLease]time.Time{}
	var open []*faultsLease
	for _, b := range byGrant {
		open = slices.DeleteFunc(open, func(a *faultsLease) bool { return !a.end.After(b.grant) })
		for _, a := range open {
			if a.client == b.client {
				continue
			}
			to := earlier(earlier(a.end, b.end), end)
			if why := r.excused(a, b); why != "" {
				tl.Overlaps = append(tl.Overlaps, r.span(a.client, b.client, b.grant, to, "excused"))
				row.Excused++
				if row.Why == nil {
					row.Why = map[string]int{}
				}
				row.Why[why]++
				continue
			}
			row.Overlaps++
			tl.Overlaps = append(tl.Overlaps, r.span(a.client, b.client, b.grant, to, "overlap"))
			d := a.end.Sub(b.grant)
			if b.end.Before(a.end) {
				d = b.end.Sub(b.grant)
			}
			row.LongestOverlap = max(row.LongestOverlap, d)
			gone[a] = max(gone[a], a.end.Sub(b.grant))
		}
		if b.end.After(b.grant) {
			open = append(open, b)
		}
	}
	for i, a := range byGrant {
		for _, b := range byGrant[i+1:] {
			if b.client != a.client {
				nextOther[a] = b.grant
				break
			}
		}
	}

	// Losses.
	var reports []time.Duration
	for _, l := range r.leases {
		if !l.reported.IsZero() {
			row.LossesReported++
			realEnd := nextOther[l]
			if !l.validUntil.IsZero() && (realEnd.IsZero() || l.validUntil.Before(realEnd)) {
				realEnd = l.validUntil
			}
			if !realEnd.IsZero() {
				reports = append(reports, l.reported.Sub(realEnd))
			}
			continue
		}
		if l.notHeld {
			row.ReleaseNotHeld++
		}
		if _, ok := gone[l]; ok || l.refused {
			row.LossesUnreported++
			if d, ok := gone[l]; ok {
				row.UnreportedFor = max(row.UnreportedFor, d)
			}
		}
	}
	slices.Sort(reports)
	row.LossReportN = len(reports)
	if len(reports) > 0 {
		row.LossReportP50, row.LossReportP99 = Percentile(reports, 50), Percentile(reports, 99)
	}

	// Recovery after the last heal.
	var healed time.Time
	for _, w := range r.windows {
		if w.to.After(healed) {
			healed = w.to
		}
	}
	if !healed.IsZero() {
		first := map[int]time.Time{}
		for _, l := range byGrant {
			if _, ok := first[l.client]; !ok && !l.grant.Before(healed) {
				first[l.client] = l.grant
			}
		}
		if len(first) > 0 {
			var earliest, latest time.Time
			for _, g := range first {
				if earliest.IsZero() || g.Before(earliest) {
					earliest = g
				}
				if g.After(latest) {
					latest = g
				}
			}
			row.Recovery = earliest.Sub(healed)
			if len(first) == r.cfg.Clients {
				row.RecoveryAll = latest.Sub(healed)
			}
		}
	}

	// The longest time without a grant.
	prev := r.epoch
	for _, l := range byGrant {
		row.LongestGap = max(row.LongestGap, l.grant.Sub(prev))
		prev = l.grant
	}
	row.LongestGap = max(row.LongestGap, end.Sub(prev))
}

// summary is the row in one line, for the progress.
func (row FaultsRow) summary() string {
	return fmt.Sprintf("grants %d, faults %s, overlaps %d, fenced refused %s, out of order %d, losses %d reported / %d not, recovery %s, longest gap %s, hung %d",
		row.Grants, row.faultsText(), row.Overlaps, row.refusedText(), row.OutOfOrder, row.LossesReported, row.LossesUnreported,
		optDuration(row.Recovery), FormatDuration(row.LongestGap), row.Hung)
}

func (row FaultsRow) faultsText() string {
	var parts []string
	for _, k := range FaultKinds {
		if n := row.Faults[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func (row FaultsRow) refusedText() string {
	if !row.Fenced {
		return "-"
	}
	return fmt.Sprint(row.FencedRefused)
}

// optDuration formats d, "-" for -1 (none).
func optDuration(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return FormatDuration(d)
}

// signedDuration formats a duration that may be negative.
func signedDuration(d time.Duration) string {
	if d < 0 {
		return "-" + FormatDuration(-d)
	}
	return FormatDuration(d)
}

var faultsNotes = []string{
	"Intervals: a lease is believed held from its grant's return to the earliest of its release call, its library's loss signal " +
		"(dlock's Lease.Done, an etcd session's Done) and its validity deadline (dlock's ValidUntil; for peers without a refresh " +
		"loop, the TTL from the Lock call), all on this process's monotonic clock.",
	"overlaps: two clients' intervals overlapping in time; dlock rows excuse those a documented hazard of the backend allows " +
		"(ConnectionBound: the holder's connection reset; a server restart, where the backend does not declare SurvivesRestart) and list them. fenced refused: writes the fenced store (fence.Memory) " +
		"refused, '-' without fencing tokens. out of order: writes the unfenced log took from a holder granted before one that had written.",
	"losses reported: leases whose loss the library signalled while held; not reported: leases shown gone while believed held " +
		"(overlapped by another client's grant, or a write refused) with no signal, and the longest " +
		"time such a holder kept working after another was granted. report p50/p99: the signal's latency after the lease's real " +
		"end as seen here (the earlier of its validity deadline and the next grant to another client); negative: before it.",
	"recovery: from the last fault's end to the next grant (first) and to every client's next grant (all). longest gap: the " +
		"longest time without a grant. hung: acquisitions that returned over 1s past their ctx's deadline.",
	"faults: b black hole, r connection reset, l added latency (on a client's proxies), p server pause, R server restart " +
		"(kill, then start again; redlock: one node, a minority or a majority at once).",
}

// WriteFaults writes the report in format: FormatText, FormatMarkdown,
// FormatJSON or FormatHTML.
func WriteFaults(w io.Writer, format string, rep *FaultsReport) error {
	switch format {
	case FormatText:
		return WriteFaultsText(w, rep)
	case FormatMarkdown:
		return writeFaultsMarkdown(w, rep)
	case FormatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	case FormatHTML:
		return WriteFaultsHTML(w, rep)
	}
	return fmt.Errorf("bench faults: no %s report (want text, markdown, JSON or HTML)", format)
}

// faultsBlock is one backend's part of the report.
type faultsBlock struct {
	Backend string
	Head    string     // the backend's URL, TTL and the faults that ran
	Rows    [][]string // the table, its header first
	About   []string   // each library's configuration, and the overlaps excused
	Errors  []string
	Runs    []FaultsRow // the rows that ran, for their timelines
}

// title is the report's first lines.
func (rep *FaultsReport) title() string {
	mode := ""
	if rep.Sanity {
		mode = " SANITY MODE: the clients' locks do not exclude each other, overlaps must show;"
	}
	return fmt.Sprintf("dlock bench faults:%s %d clients per library, each through its own proxies, loop acquire → write →\n"+
		"hold %v (%.0f%% of holds 1.5×TTL) → write → release on one name for %v under a nemesis, seed %d",
		mode, rep.Clients, rep.Hold, 100*rep.Long, rep.Duration, rep.Seed)
}

// blocks is the report per backend, in the order they ran.
func (rep *FaultsReport) blocks() []faultsBlock {
	var out []faultsBlock
	for _, row := range rep.Rows {
		i := slices.IndexFunc(out, func(b faultsBlock) bool { return b.Backend == row.Backend })
		if i < 0 {
			out = append(out, faultsBlock{Backend: row.Backend, Rows: [][]string{{"library", "grants", "faults", "overlaps",
				"fenced refused", "out of order", "losses rep/unrep", "unrep. for", "report p50/p99", "recovery first/all",
				"longest gap", "hung"}}})
			i = len(out) - 1
		}
		b := &out[i]
		if b.Head == "" && row.FaultsRan != "" {
			b.Head = fmt.Sprintf("%s  %s  TTL %v\nfaults: %s", row.Backend, row.URL, row.TTL, row.FaultsRan)
		}
		lib := row.Library
		if row.Version != "" {
			lib += " " + row.Version
		}
		overlaps := fmt.Sprint(row.Overlaps)
		if row.Excused > 0 {
			overlaps += fmt.Sprintf(" (+%d excused)", row.Excused)
		}
		report := "-"
		if row.LossReportN > 0 {
			report = signedDuration(row.LossReportP50) + "/" + signedDuration(row.LossReportP99)
		}
		if row.FaultsRan != "" {
			b.Rows = append(b.Rows, []string{lib, fmt.Sprint(row.Grants), row.faultsShort(), overlaps, row.refusedText(),
				fmt.Sprint(row.OutOfOrder), fmt.Sprintf("%d/%d", row.LossesReported, row.LossesUnreported),
				optDuration(row.UnreportedFor), report, optDuration(row.Recovery) + "/" + optDuration(row.RecoveryAll),
				FormatDuration(row.LongestGap), fmt.Sprint(row.Hung)})
			b.About = append(b.About, fmt.Sprintf("%s: %s", row.Library, row.About))
			for _, why := range slices.Sorted(maps.Keys(row.Why)) {
				b.About = append(b.About, fmt.Sprintf("%s: %d overlaps excused: %s", row.Library, row.Why[why], why))
			}
			b.Runs = append(b.Runs, row)
		}
		for _, e := range row.Errors {
			b.Errors = append(b.Errors, fmt.Sprintf("ERROR %s %s: %s", row.Backend, row.Library, e))
		}
	}
	for i := range out {
		if out[i].Head == "" {
			out[i].Head = out[i].Backend
		}
	}
	return out
}

// WriteFaultsText writes a table per backend, a row per library, then each
// library's configuration and the notes.
func WriteFaultsText(w io.Writer, rep *FaultsReport) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "%s\n\n", rep.title())
	for _, b := range rep.blocks() {
		fmt.Fprintln(ew, b.Head)
		if len(b.Rows) > 1 {
			if err := writeAligned(ew, b.Rows); err != nil {
				return err
			}
		}
		for _, a := range b.About {
			fmt.Fprintln(ew, "  "+a)
		}
		for _, e := range b.Errors {
			fmt.Fprintln(ew, e)
		}
		fmt.Fprintln(ew)
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(ew, n)
	}
	return ew.err
}

// writeFaultsMarkdown writes the same as WriteFaultsText as a Markdown
// section.
func writeFaultsMarkdown(w io.Writer, rep *FaultsReport) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "## dlock bench faults\n\n%s\n\n", strings.ReplaceAll(rep.title(), "\n", " "))
	for _, b := range rep.blocks() {
		head, faults, _ := strings.Cut(b.Head, "\n")
		fmt.Fprintf(ew, "### %s\n\n%s\n\n", head, faults)
		if len(b.Rows) > 1 {
			writeMarkdownTable(ew, b.Rows)
			fmt.Fprintln(ew)
		}
		for _, a := range b.About {
			fmt.Fprintf(ew, "- %s\n", a)
		}
		for _, e := range b.Errors {
			fmt.Fprintf(ew, "- **%s**\n", e)
		}
		fmt.Fprintln(ew)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(ew, "%s\n\n", n)
	}
	return ew.err
}

// faultsShort is the faults by kind in a few characters: b3 r2 l4 p1.
func (row FaultsRow) faultsShort() string {
	var parts []string
	for _, k := range FaultKinds {
		if n := row.Faults[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s%d", faultLetter[k], n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}
