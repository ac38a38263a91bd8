package dlock

import (
	"context"
	"time"
	"unicode/utf8"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/backoff"
)

// Leader election is a lock whose holder names itself: Elect takes the lock
// name with the candidate's id as its metadata, and the lease it returns is
// the leadership. Its fencing token is the term: it strictly increases from
// one leader to the next, so a resource the leader writes to can refuse a
// deposed leader's late writes. The leadership ends as any lease does —
// Release (resign), loss (Done, Err, Context) — and the window in which a
// deposed leader may still believe it leads is bounded by ValidUntil, as
// for every lease; write with the term to close it.
//
// Compared with client-go's leaderelection: no callbacks — Elect returns
// when this candidate leads, the lease's Context ends when it stops leading;
// a controller runs its loop under that Context.
//
// Elections need a backend that stores metadata, fences and can inspect a
// lock (Capabilities Metadata and Fencing, and an Inspector driver); Elect,
// Leader and Observe return an error matching errors.ErrUnsupported
// otherwise.

// Leader is who leads an election, as the backend sees it.
type Leader struct {
	// Name is the election's name.
	Name string
	// Held reports whether anyone leads; the other fields are zero if not.
	Held bool
	// Candidate is the leader's candidate id, as given to Elect.
	Candidate string
	// Term is the leader's fencing token.
	Term uint64
	// Since is when the leader was granted leadership, when the backend
	// tells it (zero otherwise).
	Since time.Time
}

// Elect waits until candidate (a non-empty id of at most MaxMetadataLen
// bytes, such as a host name or pod name) leads the election name, then
// returns its leadership as a lease; ctx bounds the wait only. opts are as
// for Acquire, except that Metadata must be empty: the candidate is the
// lock's metadata.
func (l *Locker) Elect(ctx context.Context, name, candidate string, opts *Options) (*Lease, error) {
	if err := validateCandidate(candidate); err != nil {
		return nil, err
	}
	if opts != nil && opts.Metadata != "" {
		return nil, invalid("Elect stores the candidate as the lock's metadata: leave Options.Metadata empty")
	}
	if err := l.canElect(); err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	o.Metadata = candidate
	return l.acquire(ctx, object{name: name}, &o, true)
}

func validateCandidate(c string) error {
	switch {
	case c == "":
		return invalid("empty candidate id")
	case len(c) > MaxMetadataLen:
		return invalid("candidate id is %d bytes, over the limit of %d", len(c), MaxMetadataLen)
	case !utf8.ValidString(c):
		return invalid("candidate id is not valid UTF-8")
	}
	return nil
}

func (l *Locker) canElect() error {
	if _, ok := l.d.(driver.Inspector); !ok || !l.caps.Fencing || !l.caps.Metadata {
		return unsupported("leader election (it needs Fencing, Metadata and an Inspector driver)")
	}
	return nil
}

// Leader says who leads the election name now (Held false when nobody
// does, or while a leader has not recorded its candidate yet). The answer
// may be stale by the time it arrives: a candidate that must know whether
// it leads looks at its own lease.
func (l *Locker) Leader(ctx context.Context, name string) (Leader, error) {
	if err := ValidateName(name); err != nil {
		return Leader{}, err
	}
	if err := l.canElect(); err != nil {
		return Leader{}, err
	}
	ld, _, err := l.leader(ctx, name)
	return ld, err
}

// leader also returns the leader's remaining TTL on the server (≤ 0 when
// unknown).
func (l *Locker) leader(ctx context.Context, name string) (Leader, time.Duration, error) {
	info, err := l.d.(driver.Inspector).Inspect(ctx, name)
	if err != nil {
		return Leader{}, 0, err
	}
	ld := Leader{Name: name}
	// A candidate id is never empty: a holder without one has not recorded
	// it yet, or no longer has it (PostgreSQL writes it after the grant
	// and deletes it before the release), and is not reported as a leader,
	// which would have no candidate and term 0.
	if info.Held && info.Metadata != "" {
		ld.Held, ld.Candidate, ld.Term, ld.Since = true, info.Metadata, info.Fence, info.Since
	}
	return ld, info.TTL, nil
}

// Observe streams the leaders of the election name: the current one first,
// then each change (a new term, or nobody leading), until ctx ends or the
// Locker is closed, when the channel is closed. A receiver that falls
// behind gets the latest state, not every intermediate one.
//
// Where the backend notifies releases (Capabilities.NotifiedWait), a
// leader's end is noticed when it happens; a leader's end by expiry is
// noticed at its TTL, and a new leader after a leaderless moment by looking
// again, 5ms to the Locker's RetryMax apart.
func (l *Locker) Observe(ctx context.Context, name string) (<-chan Leader, error) {
	if ctx == nil {
		return nil, invalid("nil context")
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := l.canElect(); err != nil {
		return nil, err
	}
	o, err := (*Options)(nil).resolve(l.defaults, l.caps)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	l.bg.Add(1)
	l.mu.Unlock()
	out := make(chan Leader, 1)
	go func() {
		defer l.bg.Done()
		defer close(out)
		l.observe(ctx, name, o, out)
	}()
	return out, nil
}

func (l *Locker) observe(ctx context.Context, name string, o Options, out chan Leader) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.closing, cancel)
	defer stop()
	var (
		last  Leader
		sent  bool
		retry = backoff.Backoff{Min: 5 * time.Millisecond, Max: o.RetryMax}
	)
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for ctx.Err() == nil {
		// Watch before looking, so that a release after the look is heard.
		var notify <-chan struct{}
		stopWatch := func() {}
		if l.notifier != nil {
			if c, s, err := l.notifier.Watch(ctx, name); err == nil {
				notify, stopWatch = c, s
			}
		}
		cur, ttl, err := l.leader(ctx, name)
		delay := o.RetryMax
		switch {
		case err != nil || !cur.Held:
			delay = retry.Next()
		default:
			retry.Reset()
			if ttl > 0 { // look again at the holder's expiry if no release is heard
				delay = ttl + time.Millisecond
			}
		}
		if err == nil && (!sent || !sameLeader(cur, last)) {
			// Replace what the receiver has not taken yet.
			select {
			case <-out:
			default:
			}
			out <- cur
			last, sent = cur, true
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
		case <-notify:
		case <-timer.C:
		}
		stopWatch()
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

func sameLeader(a, b Leader) bool {
	return a.Held == b.Held && a.Candidate == b.Candidate && a.Term == b.Term
}
