package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// Records (dlockdriver.Recorder, for dlock.Once): the record of the name N
// is the persistent node R/%records/N (N escaped as in [LockPath]), whose
// data is "<retention in ms>\n<value>". It is created (or set) in a multi-op
// with a check of the holder's lock node: a holder whose node is gone (its
// session expired, its TTL passed) writes nothing. ZooKeeper keeps it across
// restarts. Retention counts from the node's mtime (the server's clock): a
// record past it is not read, and is deleted by the next read of it, or by
// a sweep of R/%records that a Record starts at most once a minute per
// Locker (up to sweepMax expired records each). A record's node needs
// read, write, create and delete permissions on R/%records.
const recordSpace = "%records"

// sweepEvery and sweepMax bound the sweeps of expired records.
const (
	sweepEvery = time.Minute
	sweepMax   = 256
)

func (d *driver) recordPath(name string) string { return spacePath(d.root, recordSpace, name) }

// Record writes h's record in a multi-op with a check that h's lock node
// still exists.
func (d *driver) Record(ctx context.Context, h dlockdriver.Handle, value string, ttl time.Duration) error {
	zh, ok := h.(*handle)
	if !ok || zh.d != d {
		return fmt.Errorf("%w: zookeeper: Record takes a lock's handle of this driver", dlock.ErrInvalid)
	}
	zh.mu.Lock()
	s, state := zh.s, zh.state
	zh.mu.Unlock()
	if state != held || s == nil {
		return fmt.Errorf("%w: zookeeper: recording: the lock node %s is gone", dlock.ErrNotHeld, zh.path)
	}
	// The lock node is R/N/<node>: the record is R/%records/N.
	parent := path.Dir(zh.path)
	rec := strings.TrimSuffix(path.Dir(parent), "/") + "/" + recordSpace + "/" + path.Base(parent)
	data := []byte(strconv.FormatInt(ttl.Milliseconds(), 10) + "\n" + value)
	check := &zk.CheckVersionRequest{Path: zh.path, Version: -1}
	var write any = &zk.CreateRequest{Path: rec, Data: data, Acl: d.acl}
	for tries := 0; ; tries++ {
		var res []zk.MultiResponse
		err := s.do(ctx, func() error {
			var err error
			res, err = s.conn.Multi(check, write)
			return err
		}, nil)
		if err == nil {
			d.maybeSweep(s, path.Dir(rec))
			return nil
		}
		if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
			// do gave the call up: it may still fill res.
			return fmt.Errorf("zookeeper: recording %s: %w", rec, err)
		}
		if len(res) < 2 || tries > 2 {
			return fmt.Errorf("zookeeper: recording %s: %w", rec, err)
		}
		switch {
		case errors.Is(res[0].Error, zk.ErrNoNode):
			return fmt.Errorf("%w: zookeeper: recording %s: the lock node %s is gone", dlock.ErrNotHeld, rec, zh.path)
		case errors.Is(res[1].Error, zk.ErrNodeExists):
			write = &zk.SetDataRequest{Path: rec, Data: data, Version: -1}
		case errors.Is(res[1].Error, zk.ErrNoNode):
			// R/%records is missing.
			err := s.do(ctx, func() error {
				_, err := s.conn.Create(path.Dir(rec), nil, 0, d.acl)
				return err
			}, nil)
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return fmt.Errorf("zookeeper: recording %s: %w", rec, err)
			}
		default:
			return fmt.Errorf("zookeeper: recording %s: %w", rec, err)
		}
	}
}

// syncer is go-zookeeper's Sync, which both connections have.
type syncer interface {
	Sync(path string) (string, error)
}

// Recorded reads name's record, after a sync: the session read with may be
// another than the one that took the lock, connected to a server that has
// not yet applied the last holder's record.
func (d *driver) Recorded(ctx context.Context, name string) (string, bool, error) {
	s, err := d.anySession(ctx)
	if err != nil {
		return "", false, err
	}
	defer s.unref()
	rec := d.recordPath(name)
	var (
		data []byte
		stat *zk.Stat
	)
	err = s.do(ctx, func() error {
		if sc, ok := s.conn.(syncer); ok {
			if _, err := sc.Sync(path.Dir(rec)); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return err
			}
		}
		var err error
		data, stat, err = s.conn.Get(rec)
		return err
	}, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("zookeeper: reading %s: %w", rec, err)
	}
	value, expired := parseRecord(data, stat, time.Now())
	if expired {
		_ = s.do(ctx, func() error { return s.conn.Delete(rec, stat.Version) }, nil) // best effort
		return "", false, nil
	}
	return value, true, nil
}

// parseRecord splits a record node's data, and says whether it has expired
// at now. Data the driver did not write counts as a record kept for ever.
func parseRecord(data []byte, stat *zk.Stat, now time.Time) (value string, expired bool) {
	ms, v, ok := strings.Cut(string(data), "\n")
	if !ok {
		return string(data), false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return string(data), false
	}
	return v, !now.Before(time.UnixMilli(stat.Mtime).Add(time.Duration(n) * time.Millisecond))
}

// maybeSweep deletes, in the background, expired records under dir, at most
// once every sweepEvery per driver.
func (d *driver) maybeSweep(s *session, dir string) {
	d.mu.Lock()
	now := time.Now()
	if now.Sub(d.swept) < sweepEvery {
		d.mu.Unlock()
		return
	}
	d.swept = now
	d.mu.Unlock()
	s.ref()
	if !d.goBG(func() { defer s.unref(); d.sweepRecords(s, dir) }) {
		s.unref()
	}
}

func (d *driver) sweepRecords(s *session, dir string) {
	ctx, cancel := context.WithTimeout(d.ctx, sweepEvery/2)
	defer cancel()
	var children []string
	err := s.do(ctx, func() error {
		var err error
		children, _, err = s.conn.Children(dir)
		return err
	}, nil)
	if err != nil {
		return
	}
	deleted := 0
	for _, c := range children {
		if deleted >= sweepMax || ctx.Err() != nil {
			return
		}
		p := dir + "/" + c
		var (
			data []byte
			stat *zk.Stat
		)
		if s.do(ctx, func() error {
			var err error
			data, stat, err = s.conn.Get(p)
			return err
		}, nil) != nil {
			continue
		}
		if _, expired := parseRecord(data, stat, time.Now()); expired {
			if s.do(ctx, func() error { return s.conn.Delete(p, stat.Version) }, nil) == nil {
				deleted++
			}
		}
	}
}
