package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/dlock/dlock/driver"
)

// LockInfo describes a lock name as the backend sees it: holder (token
// prefix, metadata, since when), remaining TTL, fence and waiters; see
// driver.LockInfo for what each field holds when the backend cannot tell.
type LockInfo = driver.LockInfo

// Inspect describes the named lock without taking it: for operators and
// admin pages, not for deciding whether to acquire (the answer may be stale
// by the time it arrives). A backend that cannot describe locks returns an
// error matching errors.ErrUnsupported.
func (l *Locker) Inspect(ctx context.Context, name string) (LockInfo, error) {
	if err := ValidateName(name); err != nil {
		return LockInfo{}, err
	}
	in, ok := l.d.(driver.Inspector)
	if !ok {
		return LockInfo{}, fmt.Errorf("%w: dlock: this backend cannot inspect locks", errors.ErrUnsupported)
	}
	return in.Inspect(ctx, name)
}

// InspectPrefix describes every lock name in use (held or waited on) that
// begins with prefix ("" for all), sorted by name. A backend that cannot
// list names returns an error matching errors.ErrUnsupported.
func (l *Locker) InspectPrefix(ctx context.Context, prefix string) ([]LockInfo, error) {
	in, ok := l.d.(driver.Inspector)
	ls, ok2 := l.d.(driver.Lister)
	if !ok || !ok2 {
		return nil, fmt.Errorf("%w: dlock: this backend cannot list locks", errors.ErrUnsupported)
	}
	names, err := ls.Names(ctx, prefix)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	names = slices.Compact(names)
	infos := make([]LockInfo, 0, len(names))
	for _, n := range names {
		info, err := in.Inspect(ctx, n)
		if err != nil {
			return nil, err
		}
		if info.Held || info.Waiters > 0 {
			infos = append(infos, info)
		}
	}
	return infos, nil
}
