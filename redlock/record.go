package redlock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	goredis "github.com/redis/go-redis/v9"
)

// Records (dlockdriver.Recorder, for dlock.Once; default layout only): on
// every node, the record of the lock P{N} is the string P{N}:record, set
// with PX to the retention by record.lua only where the node's P{N} holds
// the writer's token, prefixed with the writer's fencing token ("7 done
// …"). A record counts as written once a majority wrote it, and a lease
// that a majority no longer holds gets ErrNotHeld, its writes on a minority
// taken back (compare and delete). Recorded waits for a majority of nodes
// and returns, of the records they have, the one of the highest fencing
// token: any two majorities share a node, so the record written last by a
// majority is seen by whoever holds the lock later, even where the nodes
// beyond that majority still have an older one (their writes were still on
// the way when Record returned) — unless nodes restart without persistence,
// the hazard that Redlock's locks have too. A writer that dies between a
// minority's writes and taking them back leaves a record that counts,
// though its lease was lost: the one gap where Redlock's records are not
// fenced as the other backends' are.
var (
	//go:embed record.lua
	recordLua    string
	recordScript = goredis.NewScript(recordLua)
	//go:embed unrecord.lua
	unrecordLua    string
	unrecordScript = goredis.NewScript(unrecordLua)
)

// recordKey is the record's key beside the lock's (one hash slot).
func recordKey(lockKey string) string { return lockKey + ":record" }

// Record writes h's record on every node that still has h's lock; nil once
// a majority did.
func (d *driver) Record(ctx context.Context, h dlockdriver.Handle, value string, ttl time.Duration) error {
	rh, ok := h.(*handle)
	if !ok || rh.d != d {
		return fmt.Errorf("%w: redlock: Record takes a lock's handle of this driver", dlock.ErrInvalid)
	}
	lock := rh.keys[0]
	keys := []string{lock, recordKey(lock)}
	n, q := len(d.nodes), d.quorum
	value = strconv.FormatUint(rh.fence, 10) + " " + value
	results := fanout(d, ctx, rh.timeout(), func(ctx context.Context, _ int, nd *node) (bool, error) {
		r, err := recordScript.Run(ctx, nd.c, keys, rh.token, value, millis(ttl)).Int64()
		return r == 1, err
	})
	wrote := make([]bool, n)
	var written, not int
	var errs []error
	for range n {
		var r nodeResult[bool]
		select {
		case r = <-results:
		case <-ctx.Done():
			return fmt.Errorf("redlock: recording %q: %w", lock, ctx.Err())
		}
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.v:
			written++
			wrote[r.i] = true
		default:
			not++
		}
		if written >= q {
			return nil
		}
	}
	// Refused, or no majority: what was written on a minority would make a
	// reader count the slot done. Take it back.
	d.unrecord(ctx, rh, keys[1], value, wrote)
	if not > n-q {
		return fmt.Errorf("%w: redlock: recording %q: %d of %d nodes no longer hold the lock", dlock.ErrNotHeld, lock, not, n)
	}
	return fmt.Errorf("%w: recording %q: %d of %d nodes wrote it (taken back), %d no longer hold the lock, %d failed: %w",
		ErrNoQuorum, lock, written, n, not, len(errs), errors.Join(errs...))
}

// unrecord deletes, where it is still value, the record written on the
// nodes marked in wrote, waiting for the deletions (each bounded by the
// node timeout).
func (d *driver) unrecord(ctx context.Context, rh *handle, key, value string, wrote []bool) {
	results := fanout(d, context.WithoutCancel(ctx), rh.timeout(), func(ctx context.Context, i int, nd *node) (bool, error) {
		if !wrote[i] {
			return false, nil
		}
		r, err := unrecordScript.Run(ctx, nd.c, []string{key}, value).Int64()
		return r == 1, err
	})
	for range wrote {
		<-results
	}
}

// Recorded reads name's record on every node: once a majority answered,
// the record of the highest fencing token among theirs, or none.
func (d *driver) Recorded(ctx context.Context, name string) (string, bool, error) {
	key := recordKey(d.keys(name)[0])
	n, q := len(d.nodes), d.quorum
	type read struct {
		v  string
		ok bool
	}
	results := fanout(d, ctx, d.timeout(dlock.DefaultTTL), func(ctx context.Context, _ int, nd *node) (read, error) {
		v, err := nd.c.Get(ctx, key).Result()
		switch {
		case errors.Is(err, goredis.Nil):
			return read{}, nil
		case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
			return read{}, nil
		case err != nil:
			return read{}, err
		}
		return read{v, true}, nil
	})
	var (
		answered int
		best     string
		bestF    uint64
		found    bool
		errs     []error
	)
	for range n {
		var r nodeResult[read]
		select {
		case r = <-results:
		case <-ctx.Done():
			return "", false, fmt.Errorf("redlock: reading %q: %w", key, ctx.Err())
		}
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		answered++
		if r.v.ok {
			f, v := splitRecord(r.v.v)
			if !found || f > bestF {
				best, bestF, found = v, f, true
			}
		}
		if answered >= q {
			// The record written last by a majority is among these.
			return best, found, nil
		}
	}
	if found {
		return best, true, nil // a record counts wherever it is
	}
	return "", false, fmt.Errorf("%w: reading %q: %d of %d nodes answered, none has it: %w",
		ErrNoQuorum, key, answered, n, errors.Join(errs...))
}

// splitRecord splits a stored record into its writer's fencing token and
// its value; a record without the token (written before records carried
// one) counts as token 0.
func splitRecord(stored string) (uint64, string) {
	f, v, ok := strings.Cut(stored, " ")
	if !ok {
		return 0, stored
	}
	n, err := strconv.ParseUint(f, 10, 64)
	if err != nil {
		return 0, stored
	}
	return n, v
}
