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

// Inspect describes name (dlockdriver.Inspector): the holder is the lock
// node with the lowest sequence number under the name's parent (dlock's,
// Curator's or zk.Lock's); its token is the GUID in its name (dlock's nodes),
// its metadata the node's data, its fence the czxid, Since its mtime (the
// server's clock: when it was created, or when it was granted after a wait
// for a node with metadata, which is then written again; see queue) and
// Holder the session that owns it. An ephemeral node
// lives as long as its session, so there is no TTL to show. Every other
// lock node is a waiter.
func (d *driver) Inspect(ctx context.Context, name string) (dlockdriver.LockInfo, error) {
	info := dlockdriver.LockInfo{Name: name, TTL: -1}
	s, err := d.anySession(ctx)
	if err != nil {
		return info, err
	}
	defer s.unref()
	parent := d.parent(name)
	for {
		children, _, err := s.conn.Children(parent)
		if errors.Is(err, zk.ErrNoNode) {
			return info, nil
		}
		if err != nil {
			return info, fmt.Errorf("zookeeper: inspecting %s: %w", parent, err)
		}
		q := queue(children)
		if len(q) == 0 {
			return info, nil
		}
		data, st, err := s.conn.Get(parent + "/" + q[0].name)
		if errors.Is(err, zk.ErrNoNode) {
			continue // released meanwhile: look again
		}
		if err != nil {
			return info, fmt.Errorf("zookeeper: inspecting %s: %w", parent, err)
		}
		info.Held, info.Waiters = true, len(q)-1
		info.Token = dlockdriver.TokenPrefix(guidOf(q[0].name))
		info.Metadata = string(data)
		info.Fence, info.HasFence = uint64(st.Czxid), true
		info.Since = time.UnixMilli(st.Mtime)
		info.Holder = fmt.Sprintf("session 0x%x", st.EphemeralOwner)
		return info, ctx.Err()
	}
}

// Names lists the names held or waited on that begin with prefix
// (dlockdriver.Lister): the children of the root with lock nodes under
// them.
func (d *driver) Names(ctx context.Context, prefix string) ([]string, error) {
	s, err := d.anySession(ctx)
	if err != nil {
		return nil, err
	}
	defer s.unref()
	root := path.Dir(d.parent("x"))
	children, _, err := s.conn.Children(root)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("zookeeper: listing locks under %s: %w", root, err)
	}
	var names []string
	for _, c := range children {
		n, ok := unescapeName(c)
		if !ok || !strings.HasPrefix(n, prefix) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		locks, _, err := s.conn.Children(root + "/" + c)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return nil, fmt.Errorf("zookeeper: listing locks under %s: %w", root, err)
		}
		if len(queue(locks)) > 0 {
			names = append(names, n)
		}
	}
	return names, nil
}

// anySession returns, counted as used (unref it), a session to read with:
// one the driver has open, or one for the default TTL.
func (d *driver) anySession(ctx context.Context) (*session, error) {
	if d.shared != nil {
		d.shared.ref()
		return d.shared, nil
	}
	d.mu.Lock()
	for _, s := range d.sessions {
		s.ref()
		d.mu.Unlock()
		if err := s.wait(ctx); err != nil {
			s.unref()
			return nil, err
		}
		return s, nil
	}
	d.mu.Unlock()
	return d.session(ctx, dlock.DefaultTTL)
}

// unescapeName undoes escapeName; ok is false for a child that no name
// escapes to.
func unescapeName(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), true
}
