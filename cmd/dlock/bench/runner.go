package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock"
)

// closeTimeout bounds closing one client, and a release made after the run's
// ctx ended.
const closeTimeout = 10 * time.Second

// runner measures one target.
type runner struct {
	cfg  Config
	t    Target
	run  string // unique to the run, in every lock name
	caps *dlock.Capabilities
	// step counts the measurements reported so far in the run, of steps.
	step  *int
	steps int
}

// client is one of the ways to take locks on the target.
type client struct {
	name string // "dlock", "floor" or a peer's name
	open func(ctx context.Context) (session, error)
}

// lane is one client's part in one scenario: its sessions, what it measured
// and how it failed. A lane that failed takes no further part.
type lane struct {
	c        client
	res      *Result
	err      error
	sessions []session
	summary  string // for the progress line

	samples  []time.Duration // latency scenarios
	marks    []int           // latency scenarios: len(samples) at the end of each turn
	turnTime []time.Duration // uncontended: the time each turn spent measuring
	elapsed  time.Duration   // time spent measuring, over all rounds
	counts   []int64         // throughput scenarios: per worker, over all rounds
	rounds   []float64       // throughput scenarios: ops/s of each round
	overlaps int64
}

func (l *lane) fail(err error) {
	if l.err == nil && err != nil {
		l.err = err
	}
}

type scenario struct {
	name string
	run  func(ctx context.Context, lanes []*lane)
}

func (r *runner) measure(ctx context.Context) BackendResult {
	b := BackendResult{Backend: r.t.Backend, URL: r.t.URL}
	b.Dlock.Client, b.Floor.Client = "dlock", "floor"
	clients := []client{{"dlock", r.openDlock}, {"floor", r.openFloor}}
	results := []*Result{&b.Dlock, &b.Floor}
	if len(r.t.Peers) > 0 {
		b.Peers = make([]Result, len(r.t.Peers))
	}
	for i, p := range r.t.Peers {
		b.Peers[i] = Result{Client: p.Name, Module: p.Module, Version: moduleVersion(p.Module), About: p.About}
		clients = append(clients, client{p.Name, r.openPeer(p.Open)})
		results = append(results, &b.Peers[i])
	}
	// The progress lines' client column fits the longest name.
	width := 5
	for _, c := range clients {
		width = max(width, len(c.name))
	}
	scenarios := []scenario{
		{"uncontended", r.uncontended},
		{"handoff", r.handoff},
		{"contended", func(ctx context.Context, lanes []*lane) { r.throughput(ctx, lanes, "contended", true) }},
		{"independent", func(ctx context.Context, lanes []*lane) { r.throughput(ctx, lanes, "independent", false) }},
	}
	// Connect each client once first: one that cannot is reported once and
	// left out, rather than failing every scenario after a dial timeout.
	ok := make([]bool, len(clients))
	for i, c := range clients {
		s, err := c.open(ctx)
		if err == nil {
			err = closeAll(ctx, []session{s})
		}
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			results[i].Errors = append(results[i].Errors, "connect: "+err.Error())
			r.progress("%-8s %-*s %-11s FAILED: %v", r.t.Backend, width, c.name, "connect", err)
			continue
		}
		ok[i] = true
	}
	for _, sc := range scenarios {
		if ctx.Err() != nil {
			break
		}
		var lanes []*lane
		for i, c := range clients {
			if ok[i] {
				lanes = append(lanes, &lane{c: c, res: results[i]})
			}
		}
		if len(lanes) == 0 {
			break
		}
		sc.run(ctx, lanes)
		if ctx.Err() != nil {
			break // cut short: not a failure of the backend
		}
		for _, l := range lanes {
			*r.step++
			if l.err != nil {
				l.res.Errors = append(l.res.Errors, sc.name+": "+l.err.Error())
				r.progress("[%d/%d] %-8s %-*s %-11s FAILED: %v", *r.step, r.steps, r.t.Backend, width, l.c.name, sc.name, l.err)
				continue
			}
			r.progress("[%d/%d] %-8s %-*s %-11s %s", *r.step, r.steps, r.t.Backend, width, l.c.name, sc.name, l.summary)
		}
	}
	if r.caps != nil {
		b.Capabilities = Capabilities{
			Fencing: r.caps.Fencing, FIFO: r.caps.FIFO, NotifiedWait: r.caps.NotifiedWait,
			SurvivesRestart: r.caps.SurvivesRestart, MinTTL: r.caps.MinTTL,
		}
	}
	b.computeRatios()
	b.computePeerRatios()
	return b
}

func (r *runner) progress(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, format+"\n", args...)
	}
}

// lockName is unique to the run and to its parts (scenario, client, worker).
func (r *runner) lockName(parts ...any) string {
	var b strings.Builder
	b.WriteString("dlock-bench:")
	b.WriteString(r.run)
	for _, p := range parts {
		fmt.Fprintf(&b, ":%v", p)
	}
	return b.String()
}

func (r *runner) openDlock(ctx context.Context) (session, error) {
	l, err := r.t.Open(ctx)
	if err != nil {
		return nil, err
	}
	if r.caps == nil {
		c := l.Capabilities()
		r.caps = &c
	}
	// Default options but the TTL: the watchdog is on, as in applications.
	return &dlockSession{l: l, opts: &dlock.Options{TTL: r.cfg.TTL}}, nil
}

func (r *runner) openFloor(ctx context.Context) (session, error) {
	f, err := r.t.Floor(ctx)
	if err != nil {
		return nil, err
	}
	return &floorSession{f: f, ttl: r.cfg.TTL, prefix: runID() + ":"}, nil
}

// openPeer opens a peer's client as a floor's: the same tokens and TTL.
func (r *runner) openPeer(open FloorOpener) func(ctx context.Context) (session, error) {
	return func(ctx context.Context) (session, error) {
		f, err := open(ctx)
		if err != nil {
			return nil, err
		}
		return &floorSession{f: f, ttl: r.cfg.TTL, prefix: runID() + ":"}, nil
	}
}

// open gives every lane n sessions, each warmed up on a name of its own.
func (r *runner) open(ctx context.Context, lanes []*lane, n int, scenario string) {
	for _, l := range lanes {
		for i := range n {
			s, err := l.c.open(ctx)
			if err != nil {
				l.fail(err)
				break
			}
			l.sessions = append(l.sessions, s)
			if err := warm(ctx, s, r.lockName(scenario, l.c.name, "warm", i)); err != nil {
				l.fail(err)
				break
			}
		}
	}
}

// closeLanes closes every lane's sessions, with a fresh deadline so that a
// run cut short still gives its locks back; a close failure fails the lane.
func closeLanes(ctx context.Context, lanes []*lane) {
	for _, l := range lanes {
		l.fail(closeAll(ctx, l.sessions))
		l.sessions = nil
	}
}

// alternate runs step for every lane that has not failed, rounds times,
// reversing the order of the lanes every round: each client is measured in
// short turns right next to the other, so that a change in the machine's
// load or the server's state weighs on both alike. It stops when ctx ends.
func alternate(ctx context.Context, rounds int, lanes []*lane, step func(l *lane, round int) error) {
	for round := range rounds {
		for i := range lanes {
			l := lanes[i]
			if round%2 == 1 {
				l = lanes[len(lanes)-1-i]
			}
			if ctx.Err() != nil {
				return
			}
			if l.err == nil {
				l.fail(step(l, round))
			}
		}
	}
}

// share returns the part of total that round gets out of rounds.
func share(total, rounds, round int) int {
	return total/rounds + btoi(round < total%rounds)
}

// turns is how many turns a latency scenario of n samples is cut into: at
// least Rounds, and more so that a turn takes about perTurn samples.
func (r *runner) turns(n, perTurn int) int {
	return max(r.cfg.Rounds, n/perTurn)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
