package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redishub"
	goredis "github.com/redis/go-redis/v9"
)

// Inspect describes name (dlockdriver.Inspector): the holder's token
// prefix, remaining TTL and fence (the counter, which is always the current
// holder's), and the number of queued waiters (live or not yet expired);
// for a holder with metadata, that metadata and when it was granted (the
// server's clock). The compat layout stores no fence, queue or metadata,
// and the default layout records when a lock was taken only for a holder
// with metadata.
func (d *driver) Inspect(ctx context.Context, name string) (dlockdriver.LockInfo, error) {
	info := dlockdriver.LockInfo{Name: name, TTL: -1, Waiters: -1}
	keys := d.keys(name)
	var get *goredis.StringCmd
	var pttl *goredis.DurationCmd
	var fence *goredis.StringCmd
	var queued *goredis.IntCmd
	var meta *goredis.StringCmd
	_, err := d.c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		get, pttl = p.Get(ctx, keys[0]), p.PTTL(ctx, keys[0])
		if !d.compat {
			fence, queued, meta = p.Get(ctx, keys[1]), p.ZCard(ctx, keys[2]), p.Get(ctx, keys[4])
		}
		return nil
	})
	if err != nil && !errors.Is(err, goredis.Nil) {
		return info, fmt.Errorf("redis: inspecting %q: %w", keys[0], err)
	}
	if token, err := get.Result(); err == nil {
		info.Held, info.Token = true, dlockdriver.TokenPrefix(token)
		if t := pttl.Val(); t >= 0 {
			info.TTL = t
		}
		if fence != nil {
			if f, err := fence.Uint64(); err == nil {
				info.Fence, info.HasFence = f, true
			}
		}
		if meta != nil {
			info.Metadata, info.Since = parseMeta(meta.Val(), token)
		}
	}
	if queued != nil {
		info.Waiters = int(queued.Val())
	}
	return info, nil
}

// parseMeta reads a metadata key's value, "<token>\n<since_ms>\n<metadata>"
// (see acquire.lua), if it is the holder token's: a former holder's is
// ignored.
func parseMeta(v, token string) (string, time.Time) {
	rest, ok := strings.CutPrefix(v, token+"\n")
	if !ok || v == "" {
		return "", time.Time{}
	}
	ms, m, ok := strings.Cut(rest, "\n")
	if !ok {
		return "", time.Time{}
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return m, time.Time{}
	}
	return m, time.UnixMilli(n)
}

// Names lists the names held or queued on that begin with prefix
// (dlockdriver.Lister), by SCAN (on every master of a Cluster). The compat
// layout's keys cannot be told from other keys: it cannot list.
func (d *driver) Names(ctx context.Context, prefix string) ([]string, error) {
	if d.compat {
		return nil, fmt.Errorf("%w: redis: the compat layout's keys cannot be told from others", errors.ErrUnsupported)
	}
	var (
		mu    sync.Mutex
		names []string
	)
	scan := func(ctx context.Context, c goredis.UniversalClient) error {
		found, err := redishub.ScanNames(ctx, c, d.prefix, prefix, ":queue")
		mu.Lock()
		names = append(names, found...)
		mu.Unlock()
		return err
	}
	var err error
	if cc, ok := d.c.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, d.c)
	}
	if err != nil {
		return nil, fmt.Errorf("redis: listing locks: %w", err)
	}
	return names, nil
}
