// Package bench measures dlock drivers against their backends' raw-client
// floors: the scenarios, the measurements, the percentile math and the
// rendering behind `dlock bench`.
//
// Every scenario runs for two clients in the same run: the dlock driver (a
// dlock.Locker opened from the backend's URL, default options, so the
// watchdog is on) and the backend's Floor, the minimal client calls with no
// library. The two take turns within each scenario (Config.Rounds), so that
// a change in the machine's load weighs on both alike: the interesting
// figures are the ratios.
//
// A target may also have peers (Target.Peers, `dlock bench -peers`): the
// locks of other libraries on the same backend (redsync, redislock, etcd's
// concurrency.Mutex, zk.Lock, pg_advisory_lock), each opened per worker as
// a floor is and waiting with the library's own wait (Waiter). They take
// their turns with dlock and the floor in every scenario, and the report
// sets dlock beside the fastest of them (BackendResult.VsPeers).
//
// # Scenarios
//
//   - uncontended: one worker, TryAcquire + Release on one name, N times:
//     p50, p99, ops/s.
//   - handoff: a holder holds a name, a waiter (an independent Locker) is
//     blocked in Acquire; after Settle the holder releases at t0 and the
//     waiter's Acquire returns at t1: p50/p99 of t1−t0. The floor's waiter
//     spins TryLock, the raw client's only way to wait.
//   - contended: Workers workers, each with its own Locker (as separate
//     processes would have), loop Acquire → Release on ONE name for Duration:
//     total ops/s and fairness (min/max of per-worker counts).
//   - independent: the same workers on one name each: total ops/s.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/dlock/dlock"
)

// Config sets the size of a run. Zero fields take the defaults named.
type Config struct {
	// Duration of each throughput scenario (contended, independent). Default 3s.
	Duration time.Duration `json:"duration_ns"`
	// N is the number of uncontended acquire+release iterations. Default 2000.
	N int `json:"n"`
	// HandoffN is the number of handoffs measured. Default 200.
	HandoffN int `json:"handoff_n"`
	// Workers in the contended and independent scenarios. Default 8.
	Workers int `json:"workers"`
	// TTL of every lock taken. Default 10s.
	TTL time.Duration `json:"ttl_ns"`
	// Settle is how long a handoff waiter is given to reach its wait before
	// the holder releases: dlock has no event saying a waiter is waiting.
	// Default 20ms.
	Settle time.Duration `json:"settle_ns"`
	// Rounds is how many turns each throughput scenario is cut into, and the
	// fewest for a latency scenario (those take turns of about 20 uncontended
	// iterations or 5 handoffs): the dlock and floor clients take turns,
	// dlock first in even rounds and the floor first in odd ones, so that
	// both meet the same conditions. Default 4.
	Rounds int `json:"rounds"`
	// Progress receives one line per measurement; nil for none.
	Progress io.Writer `json:"-"`
}

// Defaults for Config fields left zero.
const (
	DefaultDuration = 3 * time.Second
	DefaultN        = 2000
	DefaultHandoffN = 200
	DefaultWorkers  = 8
	DefaultTTL      = 10 * time.Second
	DefaultSettle   = 20 * time.Millisecond
	DefaultRounds   = 4
)

func (c Config) withDefaults() (Config, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Duration, DefaultDuration)
	def(&c.TTL, DefaultTTL)
	def(&c.Settle, DefaultSettle)
	if c.N == 0 {
		c.N = DefaultN
	}
	if c.HandoffN == 0 {
		c.HandoffN = DefaultHandoffN
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Rounds == 0 {
		c.Rounds = DefaultRounds
	}
	switch {
	case c.Duration < 0, c.TTL < 0, c.Settle < 0, c.N < 0, c.HandoffN < 0, c.Workers < 0, c.Rounds < 0:
		return c, fmt.Errorf("bench: negative setting in %+v", c)
	case c.TTL < time.Millisecond:
		return c, fmt.Errorf("bench: TTL %v is below 1ms", c.TTL)
	}
	return c, nil
}

// Target is one backend under test.
type Target struct {
	// Backend names it, as in `-backends`.
	Backend string
	// URL is shown in the report; it must already be redacted (dlock.Redact).
	URL string
	// Open returns a new, independent Locker on the backend at each call.
	Open func(ctx context.Context) (*dlock.Locker, error)
	// Floor opens a new, independent raw client at each call.
	Floor FloorOpener
	// Peers are other libraries' locks on the backend, measured beside
	// dlock and the floor; none by default.
	Peers []Peer
}

// Report is the outcome of a run.
type Report struct {
	Started    time.Time `json:"started"`
	GoVersion  string    `json:"go_version"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	NumCPU     int       `json:"num_cpu"`
	// Machine and Version describe where the run ran: the CPU model and OS
	// (from /proc/cpuinfo and /etc/os-release where there are), and dlock's
	// module version ("(devel)" in a checkout).
	CPU     string `json:"cpu,omitempty"`
	OS      string `json:"os"`
	Version string `json:"dlock_version,omitempty"`
	Config  Config `json:"config"`
	// LoadStart and LoadEnd are the machine's load averages over 1, 5 and
	// 15 minutes (/proc/loadavg) when the run started and ended; absent
	// where there are none.
	LoadStart []float64       `json:"load_start,omitempty"`
	LoadEnd   []float64       `json:"load_end,omitempty"`
	Backends  []BackendResult `json:"backends"`
}

// Err joins every scenario error of the report, or returns nil.
func (r *Report) Err() error {
	var errs []error
	for _, b := range r.Backends {
		for _, res := range b.results() {
			for _, e := range res.Errors {
				errs = append(errs, fmt.Errorf("%s %s: %s", b.Backend, res.Client, e))
			}
		}
	}
	return errors.Join(errs...)
}

// BackendResult is one backend's rows: the driver, its floor, and the peers
// when there are.
type BackendResult struct {
	Backend      string       `json:"backend"`
	URL          string       `json:"url"`
	Capabilities Capabilities `json:"capabilities"`
	Dlock        Result       `json:"dlock"`
	Floor        Result       `json:"floor"`
	Ratios       Ratios       `json:"ratios"`
	// VsFloor is dlock's speed as a multiple of the floor's in each
	// scenario, with its range over the rounds: higher is better.
	VsFloor Speeds `json:"vs_floor"`
	// Peers are the other libraries measured beside dlock (Target.Peers),
	// and VsPeers dlock against the fastest of them; both absent without
	// peers.
	Peers   []Result    `json:"peers,omitempty"`
	VsPeers *PeerRatios `json:"vs_peers,omitempty"`
}

// results are the backend's rows: dlock, the floor, the peers.
func (b *BackendResult) results() []Result {
	return append([]Result{b.Dlock, b.Floor}, b.Peers...)
}

// Capabilities are those the driver declares (dlock.Capabilities).
type Capabilities struct {
	Fencing         bool          `json:"fencing"`
	FIFO            bool          `json:"fifo"`
	NotifiedWait    bool          `json:"notified_wait"`
	SurvivesRestart bool          `json:"survives_restart"`
	MinTTL          time.Duration `json:"min_ttl_ns"`
}

// Result is the measurements of one client (dlock, floor or a peer) on one
// backend. A scenario that failed is nil and its error is in Errors.
type Result struct {
	Client string `json:"client"`
	// Module, Version and About describe a peer: the Go module of its
	// library, the module's version in this binary, and its setup.
	Module      string      `json:"module,omitempty"`
	Version     string      `json:"version,omitempty"`
	About       string      `json:"about,omitempty"`
	Uncontended *Latency    `json:"uncontended,omitempty"`
	Handoff     *Latency    `json:"handoff,omitempty"`
	Contended   *Throughput `json:"contended,omitempty"`
	Independent *Throughput `json:"independent,omitempty"`
	Errors      []string    `json:"errors,omitempty"`
}

// Latency is a latency scenario's outcome.
type Latency struct {
	N         int           `json:"n"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	Mean      time.Duration `json:"mean_ns"`
	Max       time.Duration `json:"max_ns"`
	OpsPerSec float64       `json:"ops_per_sec,omitempty"`
	// Quantiles are the 0th to 100th percentiles (101 values): the
	// distribution, for the HTML report's CDF.
	Quantiles []time.Duration `json:"quantiles_ns,omitempty"`
	// Rounds are the figures of each round (the samples cut into
	// Config.Rounds parts in the order taken, each part a run of whole
	// turns): their spread says how far the figures above can be trusted.
	Rounds []RoundLatency `json:"rounds,omitempty"`
}

// RoundLatency is one round's part of a latency scenario.
type RoundLatency struct {
	N         int           `json:"n"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	OpsPerSec float64       `json:"ops_per_sec,omitempty"`
}

// Throughput is a throughput scenario's outcome.
type Throughput struct {
	Workers   int           `json:"workers"`
	Elapsed   time.Duration `json:"elapsed_ns"`
	Ops       int64         `json:"ops"`
	OpsPerSec float64       `json:"ops_per_sec"`
	PerWorker []int64       `json:"per_worker"`
	Min       int64         `json:"min"`
	Max       int64         `json:"max"`
	// Fairness is Min/Max.
	Fairness float64 `json:"fairness"`
	// RoundOpsPerSec is the throughput of each round (Config.Rounds): a
	// wide spread means the figure is not stable on this machine.
	RoundOpsPerSec []float64 `json:"round_ops_per_sec"`
	// Overlaps counts acquisitions granted while another worker still held
	// the same name: a correct lock has none.
	Overlaps int64 `json:"overlaps"`
}

// Ratios compare the rows; 0 when a side is missing. Their directions
// differ (a p50 ratio above 1 is slower, an ops/s ratio above 1 faster):
// the report shows VsFloor, which always reads "higher is better".
type Ratios struct {
	// UncontendedP50 is dlock's uncontended p50 over the floor's.
	UncontendedP50 float64 `json:"uncontended_p50_dlock_over_floor"`
	// HandoffDlock is dlock's handoff p50 over dlock's uncontended p50.
	HandoffDlock float64 `json:"handoff_p50_over_uncontended_p50_dlock"`
	// HandoffFloor is the floor's handoff p50 over the floor's uncontended p50.
	HandoffFloor float64 `json:"handoff_p50_over_uncontended_p50_floor"`
	// ContendedOps is dlock's contended ops/s over the floor's.
	ContendedOps float64 `json:"contended_ops_dlock_over_floor"`
}

func (b *BackendResult) computeRatios() {
	d, f := b.Dlock, b.Floor
	if d.Uncontended != nil && f.Uncontended != nil {
		b.Ratios.UncontendedP50 = ratio(float64(d.Uncontended.P50), float64(f.Uncontended.P50))
	}
	if d.Handoff != nil && d.Uncontended != nil {
		b.Ratios.HandoffDlock = ratio(float64(d.Handoff.P50), float64(d.Uncontended.P50))
	}
	if f.Handoff != nil && f.Uncontended != nil {
		b.Ratios.HandoffFloor = ratio(float64(f.Handoff.P50), float64(f.Uncontended.P50))
	}
	if d.Contended != nil && f.Contended != nil {
		b.Ratios.ContendedOps = ratio(d.Contended.OpsPerSec, f.Contended.OpsPerSec)
	}
	b.VsFloor = Speeds{
		Uncontended: latencySpeed(d.Uncontended, f.Uncontended),
		Handoff:     latencySpeed(d.Handoff, f.Handoff),
		Contended:   throughputSpeed(d.Contended, f.Contended),
		Independent: throughputSpeed(d.Independent, f.Independent),
	}
}

// Speeds are one client's speed as a multiple of another's, per scenario;
// a scenario either side lacks is nil.
type Speeds struct {
	Uncontended *Speed `json:"uncontended,omitempty"`
	Handoff     *Speed `json:"handoff,omitempty"`
	Contended   *Speed `json:"contended,omitempty"`
	Independent *Speed `json:"independent,omitempty"`
}

// Speed is how many times as fast one client is as another: for a latency
// the other's p50 over this one's, for a throughput this one's ops/s over
// the other's. Higher is better; 1 is as fast. Min and Max are the lowest
// and highest of the same ratio taken round by round (the two clients take
// their turns side by side, so a round's ratio compares like with like);
// both 0 when the rounds do not pair up.
type Speed struct {
	X   float64 `json:"x"`
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

// roundRatio is a/b for one round: 0 when a is 0 (that client did
// nothing in the round), -1 when b is not positive (no ratio).
func roundRatio(a, b float64) float64 {
	if b <= 0 || a < 0 {
		return -1
	}
	return a / b
}

// spanRatios sets s.Min and s.Max from the rounds' ratios, unless one of
// them has none.
func (s *Speed) spanRatios(rs []float64) {
	for _, r := range rs {
		if r < 0 {
			return
		}
	}
	s.Min, s.Max = span(rs)
}

// latencySpeed is a's speed over b's by their p50s, or nil.
func latencySpeed(a, b *Latency) *Speed {
	if a == nil || b == nil {
		return nil
	}
	x := ratio(float64(b.P50), float64(a.P50))
	if x == 0 {
		return nil
	}
	s := &Speed{X: x}
	if len(a.Rounds) == len(b.Rounds) {
		rs := make([]float64, len(a.Rounds))
		for i := range a.Rounds {
			rs[i] = roundRatio(float64(b.Rounds[i].P50), float64(a.Rounds[i].P50))
		}
		s.spanRatios(rs)
	}
	return s
}

// throughputSpeed is a's speed over b's by their ops/s, or nil.
func throughputSpeed(a, b *Throughput) *Speed {
	if a == nil || b == nil {
		return nil
	}
	x := ratio(a.OpsPerSec, b.OpsPerSec)
	if x == 0 {
		return nil
	}
	s := &Speed{X: x}
	if len(a.RoundOpsPerSec) == len(b.RoundOpsPerSec) {
		rs := make([]float64, len(a.RoundOpsPerSec))
		for i := range rs {
			rs[i] = roundRatio(a.RoundOpsPerSec[i], b.RoundOpsPerSec[i])
		}
		s.spanRatios(rs)
	}
	return s
}

// PeerRatios compare dlock with the fastest peer in each scenario: the
// peer with the lowest p50 for a latency, the highest ops/s for a
// throughput. A scenario no peer (or dlock) measured is absent.
type PeerRatios struct {
	// Uncontended is dlock's uncontended p50 over the lowest peer's.
	Uncontended *PeerRatio `json:"uncontended_p50,omitempty"`
	// Handoff is dlock's handoff p50 over the lowest peer's.
	Handoff *PeerRatio `json:"handoff_p50,omitempty"`
	// Contended is dlock's contended ops/s over the highest peer's.
	Contended *PeerRatio `json:"contended_ops,omitempty"`
	// Independent is dlock's independent ops/s over the highest peer's.
	Independent *PeerRatio `json:"independent_ops,omitempty"`
}

// PeerRatio is dlock over the fastest peer in one scenario. Ratio is
// dlock's figure over the peer's (for a p50 below 1 is faster); Speed is
// dlock's speed over the peer's, higher is better, with its range over the
// rounds.
type PeerRatio struct {
	Peer  string  `json:"peer"`
	Ratio float64 `json:"ratio"`
	Speed *Speed  `json:"speed,omitempty"`
}

// computePeerRatios sets VsPeers when there are peers.
func (b *BackendResult) computePeerRatios() {
	if len(b.Peers) == 0 {
		b.VsPeers = nil
		return
	}
	// best is dlock's figure over the best peer's; lower tells whether a
	// lower figure is better.
	best := func(dlock float64, of func(Result) float64, lower bool) *PeerRatio {
		var r *PeerRatio
		var top float64
		for _, p := range b.Peers {
			v := of(p)
			if v <= 0 {
				continue
			}
			if r == nil || (lower && v < top) || (!lower && v > top) {
				r, top = &PeerRatio{Peer: p.Client}, v
			}
		}
		if r == nil || dlock <= 0 {
			return nil
		}
		r.Ratio = dlock / top
		return r
	}
	p50 := func(l *Latency) float64 {
		if l == nil {
			return 0
		}
		return float64(l.P50)
	}
	ops := func(t *Throughput) float64 {
		if t == nil {
			return 0
		}
		return t.OpsPerSec
	}
	d := b.Dlock
	b.VsPeers = &PeerRatios{
		Uncontended: best(p50(d.Uncontended), func(r Result) float64 { return p50(r.Uncontended) }, true),
		Handoff:     best(p50(d.Handoff), func(r Result) float64 { return p50(r.Handoff) }, true),
		Contended:   best(ops(d.Contended), func(r Result) float64 { return ops(r.Contended) }, false),
		Independent: best(ops(d.Independent), func(r Result) float64 { return ops(r.Independent) }, false),
	}
	peer := func(name string) Result {
		for _, p := range b.Peers {
			if p.Client == name {
				return p
			}
		}
		return Result{}
	}
	if r := b.VsPeers.Uncontended; r != nil {
		r.Speed = latencySpeed(d.Uncontended, peer(r.Peer).Uncontended)
	}
	if r := b.VsPeers.Handoff; r != nil {
		r.Speed = latencySpeed(d.Handoff, peer(r.Peer).Handoff)
	}
	if r := b.VsPeers.Contended; r != nil {
		r.Speed = throughputSpeed(d.Contended, peer(r.Peer).Contended)
	}
	if r := b.VsPeers.Independent; r != nil {
		r.Speed = throughputSpeed(d.Independent, peer(r.Peer).Independent)
	}
}

// Run measures every target in turn. Scenario failures are recorded in the
// report (see Report.Err) and the run goes on; Run returns an error only when
// the configuration is invalid or ctx ends, and then the report holds what
// was measured so far. ctx bounds the whole run.
func Run(ctx context.Context, cfg Config, targets []Target) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Started: time.Now(), GoVersion: runtime.Version(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(), Config: cfg,
		CPU: cpuModel(), OS: osName(), Version: dlockVersion(), LoadStart: loadAverage(),
	}
	defer func() { rep.LoadEnd = loadAverage() }()
	total := 0 // scenarios × clients: the progress lines' denominator
	for _, t := range targets {
		total += 4 * (2 + len(t.Peers))
	}
	step := 0
	for _, t := range targets {
		if t.Open == nil || t.Floor == nil {
			return rep, fmt.Errorf("bench: target %q lacks Open or Floor", t.Backend)
		}
		seen := map[string]bool{"dlock": true, "floor": true}
		for _, p := range t.Peers {
			if p.Name == "" || seen[p.Name] || p.Open == nil {
				return rep, fmt.Errorf("bench: target %q: peer %q has no name, a name taken already, or no Open", t.Backend, p.Name)
			}
			seen[p.Name] = true
		}
		r := &runner{cfg: cfg, t: t, run: runID(), step: &step, steps: total}
		b := r.measure(ctx)
		rep.Backends = append(rep.Backends, b)
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// runID makes lock names unique to one run, so that runs against a shared
// server never meet each other's (or a crashed run's) keys.
func runID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
