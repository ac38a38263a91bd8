// One file, over 600 lines: the Chaos section is one run — clients, the
// path and server nemeses, the witness that records every lease, and the
// checks over what it recorded — sharing one chaosRun; split, each piece
// would need the others to be read.

package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
)

// ServerFaults is an optional interface of a Harness: faults of the backend
// itself, which every locker shares. The Chaos section pauses and restarts
// the backend when the harness implements it; a harness on a server it may
// not break (one shared with other tests, an external one) does not.
type ServerFaults interface {
	// PauseServer freezes the backend (docker pause): connections stay open
	// and nothing is answered until ResumeServer.
	PauseServer(ctx context.Context) error
	// ResumeServer ends a PauseServer.
	ResumeServer(ctx context.Context) error
	// RestartServer kills the backend as a crash would and starts it again
	// at the same address, returning once it answers.
	RestartServer(ctx context.Context) error
}

// Environment variables of the Chaos section.
const (
	// ChaosDurationEnv names a Go duration that replaces Config.Chaos, for
	// longer runs than CI's: DLOCK_CHAOS_DURATION=5m.
	ChaosDurationEnv = "DLOCK_CHAOS_DURATION"
	// ChaosSeedEnv names the seed of the Chaos section's random choices, to
	// replay a failed run's schedule (the faults' timing still varies):
	// DLOCK_CHAOS_SEED=12345. Default: a new seed per run, logged.
	ChaosSeedEnv = "DLOCK_CHAOS_SEED"
)

// chaosClients is the number of lockers contending in the Chaos section.
const chaosClients = 5

// chaosDuration is how long the Chaos section injects faults.
func chaosDuration(cfg Config) (time.Duration, error) {
	if v := os.Getenv(ChaosDurationEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("%s=%q: want a positive Go duration", ChaosDurationEnv, v)
		}
		return d, nil
	}
	if cfg.Chaos > 0 {
		return cfg.Chaos, nil
	}
	return 20 * time.Second, nil
}

// chaosSeed returns the seed of this run.
func chaosSeed() (uint64, error) {
	if v := os.Getenv(ChaosSeedEnv); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s=%q: want an unsigned integer", ChaosSeedEnv, v)
		}
		return s, nil
	}
	return rand.Uint64() % 1e9, nil
}

// Fault kinds, as counted and reported.
const (
	faultBlackhole = "blackhole"
	faultReset     = "reset"
	faultLatency   = "latency"
	faultPause     = "pause"
	faultRestart   = "restart"
)

var faultKinds = []string{faultBlackhole, faultReset, faultLatency, faultPause, faultRestart}

// chaosLease is one grant as its holder saw it, on the monotonic clock.
type chaosLease struct {
	id     int
	client int
	call   time.Time // Acquire called
	grant  time.Time // Acquire returned the lease
	// end is when the holder stopped believing it held the lock: the
	// earliest of the Release call, the loss signal (as seen) and the
	// lease's final ValidUntil. The believed interval is [grant, end).
	end      time.Time
	fence    uint64
	ended    string    // how the belief ended: "release", "loss", "validity"
	lossErr  error     // the lease's Err once it ended by loss
	relErr   error     // what Release returned
	notHeld  bool      // Release found the lock gone
	lost     bool      // the lease ended lost (ErrLost), signalled or found by Release
	signal   bool      // the holder saw the loss signal while holding
	afterCut bool      // granted after the last heal
	epoch    time.Time // the run's start, for messages
}

func (l *chaosLease) String() string {
	return fmt.Sprintf("lease #%d (client %d, fence %d, called at +%v, granted at +%v, believed until +%v, ended by %s)",
		l.id, l.client, l.fence, l.call.Sub(l.epoch).Round(time.Millisecond), l.grant.Sub(l.epoch).Round(time.Millisecond),
		l.end.Sub(l.epoch).Round(time.Millisecond), l.ended)
}

// witness is the resource the lock protects: a store that accepts a write
// only with a fencing token at least as high as every token it accepted
// before (equal only from the same lease).
type witness struct {
	mu       sync.Mutex
	max      uint64
	by       *chaosLease
	accepted int
	rejected []witnessRejection
}

type witnessRejection struct {
	writer, newer *chaosLease // the refused lease, and the one whose token the witness held
}

func (w *witness) write(l *chaosLease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.by == nil || l.fence > w.max || (l.fence == w.max && w.by == l) {
		w.max, w.by = l.fence, l
		w.accepted++
		return
	}
	w.rejected = append(w.rejected, witnessRejection{writer: l, newer: w.by})
}

// faultEvent is a fault that may free a lock at once on some backends: a
// reset of a path, a heal that resets a path's lossy connections, or a
// server restart (from at to until).
type faultEvent struct {
	client    int // -1: the server
	at, until time.Time
	kind      string
}

// chaosRun is the state of one run of the Chaos section.
type chaosRun struct {
	s      *suite
	seed   uint64
	name   string
	epoch  time.Time
	srv    ServerFaults
	faults []Faults

	mu       sync.Mutex
	leases   []*chaosLease
	events   []faultEvent   // resets, heals, restarts
	pauses   [][2]time.Time // from PauseServer's return to ResumeServer's call
	healed   time.Time      // the last heal; zero during the fault phase
	acqErrs  map[string]int
	relErrs  map[string]int
	apiErrs  []string
	lastErrs map[int]string    // each client's last acquisition error after the heal
	examples map[string]string // the first acquisition error of each kind

	counts  [5]atomic.Int64 // by faultKinds index
	witness witness

	excusedOverlaps map[string]int // set by check
}

func (r *chaosRun) count(kind string) {
	r.counts[slices.Index(faultKinds, kind)].Add(1)
}

func (r *chaosRun) event(client int, kind string, at, until time.Time) {
	r.mu.Lock()
	r.events = append(r.events, faultEvent{client: client, at: at, until: until, kind: kind})
	r.mu.Unlock()
}

// between returns a random duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// sleepCtx sleeps for d or until ctx ends, reporting whether it slept
// through.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// testChaos is the Chaos section. Five lockers, each through its own
// Faults, loop on one name: Acquire (or TryAcquire; waits of various
// lengths, some cut short) → a write to the witness with the lease's fencing
// token → a hold, mostly short, sometimes past the TTL → a second write →
// Release. Meanwhile a nemesis seeded from DLOCK_CHAOS_SEED breaks each
// path in turn (black hole, reset, latency) and, when the harness has
// ServerFaults, pauses and restarts the backend, for Config.Chaos. Then
// everything heals and each locker takes the lock once more.
//
// The checks, all on the monotonic clock of this process:
//
//   - Exclusion: a lease is believed held from when Acquire returned it to
//     the earliest of the Release call, the loss signal as the holder saw
//     it, and its final ValidUntil; no two such intervals overlap. The only
//     overlaps allowed are those the driver declares: a restart when it does
//     not declare SurvivesRestart, and with ConnectionBound a reset (or a
//     heal, which resets the connections that lost bytes) of the earlier
//     holder's path, or a restart. They are counted.
//   - Fence order (with Fencing): a lease whose Acquire began after another
//     lease was returned has a higher token, and no two leases share one;
//     the witness, which refuses a token lower than one it accepted, never
//     refuses a lease granted after the one whose token it holds.
//   - A paused backend grants nothing (unless Config.PartialServerFaults):
//     no Acquire begun after PauseServer returned gets a lease before
//     ResumeServer is called.
//   - The lease API agrees with itself: a successful Release leaves Err
//     ErrReleased, one that found the lock gone leaves ErrLost.
//   - Liveness: after the last heal every locker is granted again within
//     10s + 14×(TTL + ExpirySlack), and with every lease released, and the
//     lockers still open, the backend comes back to storing nothing for the
//     name (Residue) within 2×(TTL + ExpirySlack) + 2s.
//
// The figures of the run (grants, faults by kind, losses, errors, witness
// writes, violations, recovery time) are logged.
func testChaos(s *suite) {
	d, err := chaosDuration(s.cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	seed, err := chaosSeed()
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("chaos: seed %d (replay with %s=%d), faults for %v", seed, ChaosSeedEnv, seed, d)
	s.t.Cleanup(func() {
		if s.t.Failed() {
			s.t.Logf("chaos: the failed run's seed is %d (%s=%d)", seed, ChaosSeedEnv, seed)
		}
	})
	r := &chaosRun{
		s: s, seed: seed, name: s.name(), epoch: time.Now(),
		acqErrs: map[string]int{}, examples: map[string]string{}, relErrs: map[string]int{}, lastErrs: map[int]string{},
	}
	r.srv, _ = s.h.(ServerFaults)
	lockers := make([]*dlock.Locker, chaosClients)
	r.faults = make([]Faults, chaosClients)
	for i := range lockers {
		lockers[i], r.faults[i] = s.locker(s.opts())
	}
	r.run(lockers, d)
}

func (r *chaosRun) run(lockers []*dlock.Locker, d time.Duration) {
	s := r.s
	ttl := s.cfg.TTL
	// The clients loop until stop is closed (end of the fault phase for
	// those done, or the liveness bound), each taking the lock once more
	// after the last heal before it quits.
	runCtx, stop := context.WithCancel(s.ctx)
	defer stop()
	var clients sync.WaitGroup
	recovered := make([]chan struct{}, len(lockers))
	for i, l := range lockers {
		recovered[i] = make(chan struct{})
		rng := rand.New(rand.NewPCG(r.seed, uint64(i)))
		clients.Go(func() { r.client(runCtx, i, l, rng, recovered[i]) })
	}

	// The nemesis: one goroutine per locker's path and one for the server.
	faultCtx, endFaults := context.WithTimeout(s.ctx, d)
	defer endFaults()
	var nemesis sync.WaitGroup
	for i, f := range r.faults {
		rng := rand.New(rand.NewPCG(r.seed, uint64(100+i)))
		nemesis.Go(func() { r.pathNemesis(faultCtx, i, f, rng) })
	}
	if r.srv != nil {
		rng := rand.New(rand.NewPCG(r.seed, 200))
		nemesis.Go(func() { r.serverNemesis(faultCtx, rng) })
	}
	nemesis.Wait() // each heals what it broke before returning
	healed := time.Now()
	r.mu.Lock()
	r.healed = healed
	r.mu.Unlock()

	// Liveness: every client is granted again within the bound, counted
	// from the last heal. It covers a lock left by a release lost in a fault
	// expiring (TTL + ExpirySlack), reconnection back-offs, and each client
	// waiting for the others' turns.
	slack := ttl + s.caps.ExpirySlack
	bound := 10*time.Second + time.Duration(2*chaosClients+4)*slack
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	var late []int
wait:
	for i, ch := range recovered {
		select {
		case <-ch:
		case <-deadline.C:
		case <-s.ctx.Done():
		}
		select {
		case <-ch:
			continue
		default:
		}
		for j := i; j < len(recovered); j++ {
			select {
			case <-recovered[j]:
			default:
				late = append(late, j)
			}
		}
		break wait
	}
	var residueAtStall []string
	var residueErr error
	if late != nil {
		// Look at the backend while the clients still wait: what holds
		// them up is there.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		residueAtStall, residueErr = s.h.Residue(ctx, r.name)
		cancel()
	}
	stop()
	clients.Wait()
	recovery := r.recovery(healed)
	if late != nil {
		recovery = -1 // reported as none
	}

	// Everything is released (or its release failed in a fault, and the lock
	// expires): the backend must come back to storing nothing for the name
	// while the lockers are still open — waiter state that their sessions
	// keep alive counts.
	left, residueWait, rerr := r.residue(slack)

	violations := r.check()
	if late != nil {
		r.mu.Lock()
		for _, i := range late {
			violations = append(violations, fmt.Sprintf("liveness: client %d not granted within %v of the last heal (its last error: %s)", i, bound, r.lastErrs[i]))
		}
		r.mu.Unlock()
		if residueErr != nil {
			violations = append(violations, fmt.Sprintf("liveness: the backend at the stall: Residue: %v", residueErr))
		} else {
			violations = append(violations, fmt.Sprintf("liveness: the backend stored for the name at the stall: %q", residueAtStall))
		}
	}
	if rerr != nil {
		violations = append(violations, fmt.Sprintf("residue: %v", rerr))
	} else if len(left) > 0 {
		violations = append(violations, fmt.Sprintf("residue: with every lease released the backend still stores %q for the name after %v", left, residueWait))
	}
	r.report(d, recovery, bound, violations)
	// Up to five of each kind (the text before the first colon).
	shown := map[string]int{}
	for _, v := range violations {
		kind, _, _ := strings.Cut(v, ":")
		if shown[kind]++; shown[kind] <= 5 {
			s.t.Errorf("chaos: %s (seed %d)", v, r.seed)
		}
	}
	for kind, n := range shown {
		if n > 5 {
			s.t.Errorf("chaos: and %d more %s violations (seed %d)", n-5, kind, r.seed)
		}
	}
}

// client loops Acquire → fenced write → hold → fenced write → Release on
// the run's name until ctx ends, or, after the last heal, until it has been
// granted once (closing recovered). It is one long loop on purpose (its
// cyclomatic complexity is 44): each step records an event the checks read,
// and the classification of every error a step can return sits beside the
// step, in the order the run meets them.
func (r *chaosRun) client(ctx context.Context, i int, l *dlock.Locker, rng *rand.Rand, recovered chan struct{}) {
	s := r.s
	ttl := s.cfg.TTL
	for ctx.Err() == nil {
		call := time.Now()
		try := rng.IntN(8) == 0
		// Waits of various lengths, some cut short while queued.
		actx, cancel := context.WithTimeout(ctx, between(rng, ttl/2, 4*ttl))
		var ls *dlock.Lease
		var err error
		if try {
			ls, err = l.TryAcquire(actx, r.name, nil)
		} else {
			ls, err = l.Acquire(actx, r.name, nil)
		}
		granted := time.Now()
		cancel()
		r.mu.Lock()
		healed := r.healed // as of the grant: a grant after it came after the cut
		r.mu.Unlock()
		if err != nil {
			kind := "other"
			switch {
			case errors.Is(err, dlock.ErrInvalid), errors.Is(err, dlock.ErrClosed):
				r.mu.Lock()
				r.apiErrs = append(r.apiErrs, fmt.Sprintf("client %d: Acquire: %v", i, err))
				r.mu.Unlock()
				return
			case ctx.Err() != nil:
				return
			case errors.Is(err, dlock.ErrNotAcquired) && (errors.Is(err, context.DeadlineExceeded) || try):
				kind = "not acquired"
			case errors.Is(err, dlock.ErrNotAcquired):
				kind = "not acquired (" + errorClass(err) + ")"
			default:
				kind = errorClass(err)
			}
			r.mu.Lock()
			r.acqErrs[kind]++
			if _, ok := r.examples[kind]; !ok {
				r.examples[kind] = fmt.Sprintf("try=%v: %s", try, strings.ReplaceAll(err.Error(), "\n", "; "))
			}
			if !healed.IsZero() {
				r.lastErrs[i] = strings.ReplaceAll(err.Error(), "\n", "; ")
			}
			r.mu.Unlock()
			if !try && errors.Is(err, context.DeadlineExceeded) {
				continue // it waited already
			}
			if !sleepCtx(ctx, between(rng, ttl/50, ttl/5)) {
				return
			}
			continue
		}
		rec := &chaosLease{epoch: r.epoch, client: i, call: call, grant: granted, afterCut: !healed.IsZero() && granted.After(healed)}
		rec.fence, _ = ls.Fence()
		r.mu.Lock()
		rec.id = len(r.leases)
		r.leases = append(r.leases, rec)
		r.mu.Unlock()

		believed := func() bool {
			select {
			case <-ls.Done():
				return false
			default:
				return time.Now().Before(ls.ValidUntil())
			}
		}
		if s.caps.Fencing && believed() {
			r.witness.write(rec)
		}
		// Mostly short holds; some long enough to need the watchdog
		// through a fault. None after the heal: recovery is about turns.
		var hold time.Duration
		switch {
		case rec.afterCut:
		case rng.IntN(5) == 0:
			hold = between(rng, ttl, 3*ttl)
		default:
			hold = between(rng, 0, ttl/4)
		}
		var lossSeen time.Time
		t := time.NewTimer(hold)
		select {
		case <-ls.Done():
			lossSeen = time.Now()
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		holdEnd := time.Now()
		if lossSeen.IsZero() && s.caps.Fencing && believed() {
			r.witness.write(rec)
		}
		relAt := time.Now()
		if lossSeen.IsZero() {
			select {
			case <-ls.Done():
				// Lost after the hold, at a moment not seen: count the
				// belief to the hold's end, which is surely before.
				lossSeen = holdEnd
			default: // still believed at relAt
			}
		}
		rctx, cancel := context.WithTimeout(s.ctx, 2*ttl)
		rerr := ls.Release(rctx)
		cancel()
		vu := ls.ValidUntil()
		switch {
		case !lossSeen.IsZero() && lossSeen.Before(vu):
			rec.end, rec.ended = lossSeen, "loss"
		case !lossSeen.IsZero() || !relAt.Before(vu):
			rec.end, rec.ended = vu, "validity"
		default:
			rec.end, rec.ended = relAt, "release"
		}
		if !lossSeen.IsZero() {
			rec.lossErr, rec.signal = ls.Err(), true
		}
		rec.lost = errors.Is(ls.Err(), dlock.ErrLost)
		rec.relErr = rerr
		switch {
		case rerr == nil && errors.Is(ls.Err(), dlock.ErrLost) && !time.Now().Before(ls.ValidUntil()):
			// The release request went out in time and succeeded, but the
			// lease's ValidUntil passed while it was under way, which
			// ended the lease first: not a loss of the lock.
			r.mu.Lock()
			r.relErrs["nil, though ValidUntil passed during the call"]++
			r.mu.Unlock()
		case rerr == nil:
			if !errors.Is(ls.Err(), dlock.ErrReleased) {
				r.apiError(fmt.Sprintf("client %d: Release returned nil but the lease's Err is %v, want ErrReleased", i, ls.Err()))
			}
		case errors.Is(rerr, dlock.ErrNotHeld):
			rec.notHeld = true
			if !errors.Is(ls.Err(), dlock.ErrLost) {
				r.apiError(fmt.Sprintf("client %d: Release returned %v but the lease's Err is %v, want ErrLost", i, rerr, ls.Err()))
			}
		default:
			r.mu.Lock()
			r.relErrs[errorClass(rerr)]++
			r.mu.Unlock()
		}
		if !lossSeen.IsZero() && !errors.Is(rec.lossErr, dlock.ErrLost) {
			r.apiError(fmt.Sprintf("client %d: the lease ended unreleased with Err %v, want ErrLost", i, rec.lossErr))
		}
		if rec.afterCut {
			close(recovered)
			return
		}
	}
}

func (r *chaosRun) apiError(msg string) {
	r.mu.Lock()
	r.apiErrs = append(r.apiErrs, msg)
	r.mu.Unlock()
}

// errorClass names an error for the counts: its text without the parts that
// vary (names, addresses, numbers), shortened.
func errorClass(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, dlock.ErrNotHeld):
		return "not held"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	var b strings.Builder
	for _, c := range msg {
		if c >= '0' && c <= '9' {
			continue
		}
		b.WriteRune(c)
	}
	msg = b.String()
	if len(msg) > 60 {
		msg = msg[:60]
	}
	return msg
}

// pathNemesis breaks locker i's path, one fault at a time, until ctx ends,
// and leaves it healed.
func (r *chaosRun) pathNemesis(ctx context.Context, i int, f Faults, rng *rand.Rand) {
	ttl := r.s.cfg.TTL
	for sleepCtx(ctx, between(rng, ttl/4, 2*ttl)) {
		switch n := rng.IntN(10); {
		case n < 4:
			r.count(faultBlackhole)
			f.Blackhole()
			sleepCtx(ctx, between(rng, ttl/4, 3*ttl))
			at := time.Now()
			f.Heal() // resets the connections that lost bytes
			r.event(i, "heal", at, time.Now())
		case n < 7:
			r.count(faultReset)
			at := time.Now()
			f.Reset()
			r.event(i, faultReset, at, time.Now())
		default:
			r.count(faultLatency)
			f.SetLatency(between(rng, ttl/50, ttl/3))
			sleepCtx(ctx, between(rng, ttl/2, 3*ttl))
			f.SetLatency(0)
		}
	}
}

// serverNemesis pauses and restarts the backend until ctx ends, and leaves
// it running. A fault the harness fails to inject or to end (its
// ServerFaults method returns an error) ends the server faults and is
// reported as the harness's failure, apart from the driver's violations:
// the run goes on with the path faults and its properties are checked.
func (r *chaosRun) serverNemesis(ctx context.Context, rng *rand.Rand) {
	s := r.s
	ttl := s.cfg.TTL
	call := func(what string, op func(context.Context) error) bool {
		octx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := op(octx); err != nil {
			s.t.Errorf("harness: could not %s the server (%T's ServerFaults failed, not the driver; "+
				"the run goes on without server faults): %v", what, s.h, err)
			return false
		}
		return true
	}
	for sleepCtx(ctx, between(rng, ttl, 4*ttl)) {
		if rng.IntN(3) > 0 {
			r.count(faultPause)
			if !call("pause", r.srv.PauseServer) {
				// It may have been paused all the same; when it was not,
				// resuming it fails, and that says nothing more.
				octx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				if err := r.srv.ResumeServer(octx); err != nil {
					s.t.Logf("harness: ResumeServer after the failed PauseServer: %v", err)
				}
				cancel()
				return
			}
			from := time.Now()
			sleepCtx(ctx, between(rng, ttl/4, 3*ttl))
			until := time.Now()
			if !call("resume", r.srv.ResumeServer) {
				s.t.Errorf("harness: the server may still be paused: liveness violations below may come from that")
				return
			}
			r.mu.Lock()
			r.pauses = append(r.pauses, [2]time.Time{from, until})
			r.mu.Unlock()
			continue
		}
		r.count(faultRestart)
		at := time.Now()
		octx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := r.srv.RestartServer(octx)
		cancel()
		if err != nil {
			// Once more: on a loaded machine a restarted container has
			// been seen not to answer within the harness's minute (twice
			// in runs beside two busy loops) and to come up when started
			// again. The driver's liveness after a heal needs a server.
			s.t.Logf("harness: restarting the server failed, trying once more: %v", err)
			if !call("restart", r.srv.RestartServer) {
				s.t.Errorf("harness: the server may still be down: liveness violations below may come from that")
				return
			}
		}
		r.event(-1, faultRestart, at, time.Now())
	}
}

// recovery returns how long after the last heal the last client was
// granted again (each client's first grant after it).
func (r *chaosRun) recovery(healed time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var worst time.Duration
	for _, l := range r.leases {
		if l.afterCut {
			worst = max(worst, l.grant.Sub(healed))
		}
	}
	return worst
}

// residue waits for the backend to store nothing for the name, up to a lost
// release's lock expiring and a little more; it returns what is left. A
// failed Residue is tried again within that time: the harness's own client
// may still be reconnecting after a server restart.
func (r *chaosRun) residue(slack time.Duration) ([]string, time.Duration, error) {
	start := time.Now()
	limit := 2*slack + 2*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), limit+10*time.Second)
	defer cancel()
	for {
		left, err := r.s.h.Residue(ctx, r.name)
		if err == nil && len(left) == 0 || time.Since(start) > limit {
			return left, time.Since(start), err
		}
		time.Sleep(r.s.cfg.TTL / 10)
	}
}

// excused reports why an overlap of a's believed interval with b's later
// grant is allowed by what the driver declares, or "" if it is not: a
// restart of a backend that does not survive one (or that ties locks to
// connections) while a held the lock, or, with ConnectionBound, a reset of
// a's connections (or a heal, which resets those that lost bytes).
func (r *chaosRun) excused(a, b *chaosLease) string {
	caps := r.s.caps
	for _, e := range r.events {
		// The fault hit after a's Acquire began, while a still believed
		// it held the lock, and before b was granted.
		if !e.at.After(a.call) || !e.at.Before(a.end) || !e.at.Before(b.grant) {
			continue
		}
		switch {
		case e.kind == faultRestart && (!caps.SurvivesRestart || caps.ConnectionBound):
			return "restart of a backend that does not keep locks across one"
		case e.client == a.client && caps.ConnectionBound:
			return "ConnectionBound lease whose connection was reset (" + e.kind + ")"
		}
	}
	return ""
}

// check runs the safety checks on the recorded leases and returns the
// violations.
func (r *chaosRun) check() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var v []string
	v = append(v, r.apiErrs...)

	// Exclusion: no two believed intervals overlap. Sorted by grant, each
	// lease is compared with the earlier ones whose belief still runs.
	byGrant := slices.Clone(r.leases)
	slices.SortFunc(byGrant, func(a, b *chaosLease) int { return a.grant.Compare(b.grant) })
	var open []*chaosLease
	excusedN := map[string]int{}
	for _, b := range byGrant {
		open = slices.DeleteFunc(open, func(a *chaosLease) bool { return !a.end.After(b.grant) })
		for _, a := range open {
			if why := r.excused(a, b); why != "" {
				excusedN[why]++
				continue
			}
			how := "its holder never learned of the loss"
			switch {
			case a.ended == "loss":
				how = fmt.Sprintf("its loss was signalled only after that: %v", a.lossErr)
			case a.notHeld:
				how = fmt.Sprintf("its Release then found it gone: %v", a.relErr)
			}
			v = append(v, fmt.Sprintf("exclusion: %v was granted while %v was still believed held (%s)", b, a, how))
		}
		if b.end.After(b.grant) {
			open = append(open, b)
		}
	}
	r.excusedOverlaps = excusedN

	if r.s.caps.Fencing {
		// Fence order: a lease whose Acquire began after another's grant
		// returned was granted after it at the server, so its token is
		// higher (whatever their believed intervals).
		byCall := slices.Clone(r.leases)
		slices.SortFunc(byCall, func(a, b *chaosLease) int { return a.call.Compare(b.call) })
		var best *chaosLease
		k := 0
		for _, b := range byCall {
			for ; k < len(byGrant) && byGrant[k].grant.Before(b.call); k++ {
				if best == nil || byGrant[k].fence > best.fence {
					best = byGrant[k]
				}
			}
			if best != nil && b.fence <= best.fence {
				v = append(v, fmt.Sprintf("fence order: %v has a token not above that of %v, granted before its Acquire began", b, best))
			}
		}
		seen := map[uint64]*chaosLease{}
		for _, l := range r.leases {
			if o, ok := seen[l.fence]; ok {
				v = append(v, fmt.Sprintf("fence order: %v and %v share a token", o, l))
			}
			seen[l.fence] = l
		}
		// The witness refused the write of a lease granted after the one
		// whose token it held: tokens went backwards, as a resource sees
		// it. (Refusing a stale holder's write is fencing at work.)
		seenW := map[*chaosLease]bool{}
		for _, w := range r.witness.rejected {
			if w.newer.grant.Before(w.writer.call) && !seenW[w.writer] {
				seenW[w.writer] = true
				v = append(v, fmt.Sprintf("witness: refused the write of %v, granted after %v whose token it had accepted", w.writer, w.newer))
			}
		}
	}

	// A paused backend (all of it, or a quorum) grants nothing: no
	// acquisition begun after the pause took effect returns a grant before
	// the resume.
	if !r.s.cfg.PartialServerFaults {
		for _, p := range r.pauses {
			for _, l := range r.leases {
				if l.call.After(p[0]) && l.grant.Before(p[1]) {
					v = append(v, fmt.Sprintf("pause: %v was granted while the server was paused (+%v to +%v)", l, p[0].Sub(r.epoch), p[1].Sub(r.epoch)))
				}
			}
		}
	}
	return v
}

// report logs the run's figures.
func (r *chaosRun) report(d, recovery, bound time.Duration, violations []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	perClient := make([]int, chaosClients)
	var lost, signalled, notHeld int
	for _, l := range r.leases {
		perClient[l.client]++
		if l.lost {
			lost++
		}
		if l.signal {
			signalled++
		}
		if l.notHeld {
			notHeld++
		}
	}
	var faults []string
	for i, k := range faultKinds {
		faults = append(faults, fmt.Sprintf("%s=%d", k, r.counts[i].Load()))
	}
	srv := "none (the harness does not implement ServerFaults)"
	if r.srv != nil {
		srv = "pause and restart"
		if r.s.cfg.PartialServerFaults {
			srv += " (part of the backend)"
		}
	}
	r.s.t.Logf("chaos: seed %d, %d clients, TTL %v, faults for %v, server faults: %s", r.seed, chaosClients, r.s.cfg.TTL, d, srv)
	r.s.t.Logf("chaos: grants=%d %v; faults: %s", len(r.leases), perClient, strings.Join(faults, " "))
	r.s.t.Logf("chaos: leases lost=%d (signalled while held=%d, found by Release=%d), failed releases=%v, acquisition errors=%v",
		lost, signalled, notHeld, r.relErrs, r.acqErrs)
	r.s.t.Logf("chaos: witness writes accepted=%d refused=%d (stale holders fenced off unless counted below); overlaps excused by declared capabilities=%v",
		r.witness.accepted, len(r.witness.rejected), r.excusedOverlaps)
	for kind, e := range r.examples {
		if kind != "not acquired" {
			r.s.t.Logf("chaos: first acquisition error of kind %q: %s", kind, e)
		}
	}
	rec := "every client granted again within " + recovery.Round(time.Millisecond).String()
	if recovery < 0 {
		rec = "not every client was granted again"
	}
	r.s.t.Logf("chaos: violations=%d; recovery after the last heal: %s (bound %v)", len(violations), rec, bound)
}
