package memory

import (
	"context"
	"strings"
	"time"

	dlockdriver "github.com/dlock/dlock/driver"
)

// Inspect describes name as the store holds it (dlockdriver.Inspector).
func (d *driver) Inspect(ctx context.Context, name string) (dlockdriver.LockInfo, error) {
	info := dlockdriver.LockInfo{Name: name, TTL: -1}
	err := d.link.Do(ctx, func() error {
		s := d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		info.Waiters = len(s.watchers[name])
		if e := s.live(name, now); e != nil {
			info.Held, info.Token, info.Metadata = true, dlockdriver.TokenPrefix(e.token), e.metadata
			info.Since, info.TTL = e.since, e.expires.Sub(now)
			info.Fence, info.HasFence = e.fence, true
		}
		return nil
	})
	return info, err
}

// Names lists the names held or waited on that begin with prefix
// (dlockdriver.Lister).
func (d *driver) Names(ctx context.Context, prefix string) ([]string, error) {
	var names []string
	err := d.link.Do(ctx, func() error {
		s := d.s
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		for n := range s.locks {
			if strings.HasPrefix(n, prefix) && s.live(n, now) != nil {
				names = append(names, n)
			}
		}
		for n := range s.watchers {
			if strings.HasPrefix(n, prefix) && !strings.HasPrefix(n, "\x00") { // other kinds' keys
				names = append(names, n)
			}
		}
		return nil
	})
	return names, err
}
