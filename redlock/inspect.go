package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redishub"
	goredis "github.com/redis/go-redis/v9"
)

// Inspect describes name as a majority of nodes sees it
// (dlockdriver.Inspector): the lock is held when one token holds it on a
// majority; TTL is how long that majority lasts (the majority-th longest
// remaining time among the token's nodes); Waiters is the longest queue of
// any node. Each node's counter may run ahead of the holder's fencing
// token (every grant on a node counts, including those of attempts that
// lost the vote), so no fence is shown. Every node is asked at once, each
// bounded by the node timeout; Inspect fails when fewer than a majority
// answer.
func (d *driver) Inspect(ctx context.Context, name string) (dlockdriver.LockInfo, error) {
	info := dlockdriver.LockInfo{Name: name, TTL: -1, Waiters: -1}
	keys := d.keys(name)
	type answer struct {
		token   string
		pttl    time.Duration
		waiters int64
		err     error
	}
	answers := make([]answer, len(d.nodes))
	var wg sync.WaitGroup
	for i, nd := range d.nodes {
		wg.Go(func() {
			nctx, cancel := nodeCtx(ctx, d.watchTimeout(), false)
			defer cancel()
			var get *goredis.StringCmd
			var pttl *goredis.DurationCmd
			var card *goredis.IntCmd
			_, err := nd.c.Pipelined(nctx, func(p goredis.Pipeliner) error {
				get, pttl, card = p.Get(nctx, keys[0]), p.PTTL(nctx, keys[0]), p.ZCard(nctx, keys[1])
				return nil
			})
			if err != nil && !errors.Is(err, goredis.Nil) {
				answers[i].err = fmt.Errorf("%s: %w", nd.name, err)
				return
			}
			answers[i] = answer{token: get.Val(), pttl: pttl.Val(), waiters: card.Val()}
		})
	}
	wg.Wait()
	var errs []error
	byToken := map[string][]time.Duration{}
	for _, a := range answers {
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		info.Waiters = max(info.Waiters, int(a.waiters))
		if a.token != "" {
			byToken[a.token] = append(byToken[a.token], a.pttl)
		}
	}
	if len(d.nodes)-len(errs) < d.quorum {
		return info, fmt.Errorf("%w: inspecting %q: %w", ErrNoQuorum, keys[0], errors.Join(errs...))
	}
	for token, pttls := range byToken {
		if len(pttls) < d.quorum {
			continue
		}
		slices.Sort(pttls)
		slices.Reverse(pttls)
		info.Held, info.Token = true, dlockdriver.TokenPrefix(token)
		if t := pttls[d.quorum-1]; t >= 0 {
			info.TTL = t
		}
	}
	return info, nil
}

// Names lists the names held or waited on, on any node, that begin with
// prefix (dlockdriver.Lister), by SCAN on every node. The compat layout's
// keys cannot be told from other keys: it cannot list.
func (d *driver) Names(ctx context.Context, prefix string) ([]string, error) {
	if d.compat {
		return nil, fmt.Errorf("%w: redlock: the compat layout's keys cannot be told from others", errors.ErrUnsupported)
	}
	var (
		mu    sync.Mutex
		names []string
		errs  []error
		wg    sync.WaitGroup
	)
	for _, nd := range d.nodes {
		wg.Go(func() {
			nctx, cancel := nodeCtx(ctx, d.watchTimeout(), false)
			defer cancel()
			found, err := redishub.ScanNames(nctx, nd.c, d.prefix, prefix, ":waiters")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", nd.name, err))
			}
			names = append(names, found...)
		})
	}
	wg.Wait()
	if len(d.nodes)-len(errs) < d.quorum {
		return nil, fmt.Errorf("%w: listing locks: %w", ErrNoQuorum, errors.Join(errs...))
	}
	return names, nil
}
