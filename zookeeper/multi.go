package zookeeper

import (
	"path"

	"github.com/go-zookeeper/zk"
)

// maxFlights bounds the grouped requests (see multi) in flight at once on
// a session.
const maxFlights = 4

// maxGroupOps and maxGroupData bound the operations of one grouped
// multi-op and the data they carry (ZooKeeper refuses packets over 1MB).
const (
	maxGroupOps  = 128
	maxGroupData = 256 << 10
)

// groupOp is one caller's operations waiting in a session's queue (see
// multi).
type groupOp struct {
	reqs []any // *zk.CreateRequest, *zk.SetDataRequest, *zk.DeleteRequest
	data int   // bytes of data in reqs
	// parents are the nodes reqs create children under: two creates under
	// one node never share a multi-op (see flush)
	parents []string
	res     []zk.MultiResponse
	err     error
	done    chan struct{}
}

// multi runs reqs as one multi-op, as conn.Multi does (a lone delete as a
// plain delete), but the operations of callers that come while requests
// are in flight on the session go together in the next multi-op (group
// commit): a ZooKeeper request costs the server far more than an
// operation in it, so thousands of concurrent acquisitions or releases
// take a few hundred requests. A caller alone goes at once. When one
// caller's operation fails the multi-op, that caller gets the failure and
// the others are sent again without it, so that each caller's operations
// are applied, or not, together and alone, and fail with their own error.
func (s *session) multi(reqs ...any) ([]zk.MultiResponse, error) {
	op := &groupOp{reqs: reqs, done: make(chan struct{})}
	for _, r := range reqs {
		switch r := r.(type) {
		case *zk.CreateRequest:
			op.data += len(r.Data) + len(r.Path)
			op.parents = append(op.parents, path.Dir(r.Path))
		case *zk.SetDataRequest:
			op.data += len(r.Data) + len(r.Path)
		case *zk.DeleteRequest:
			op.data += len(r.Path)
		}
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil, zk.ErrClosing
	}
	s.queued = append(s.queued, op)
	if s.flights < maxFlights {
		s.flights++
		s.calls.Add(1)
		go s.flush()
	}
	s.mu.Unlock()
	<-op.done
	return op.res, op.err
}

// deleteNode deletes the node at path with version (see multi).
func (s *session) deleteNode(path string, version int32) error {
	_, err := s.multi(&zk.DeleteRequest{Path: path, Version: version})
	return err
}

// flush sends the queued operations until none is left. Two creates under
// one name's node never go in one multi-op: the nodes of a multi-op share
// its zxid, each node's czxid, which is its lease's fence; two lock nodes
// of one name with one czxid would give two holders, one after the other,
// the same fence.
func (s *session) flush() {
	defer s.calls.Done()
	var parents map[string]struct{}
	for {
		s.mu.Lock()
		n, ops, data := 0, 0, 0
		clear(parents)
		for n < len(s.queued) {
			op := s.queued[n]
			if n > 0 && (ops+len(op.reqs) > maxGroupOps || data+op.data > maxGroupData || sharesParent(parents, op.parents)) {
				break
			}
			n++
			ops += len(op.reqs)
			data += op.data
			if len(op.parents) > 0 {
				if parents == nil {
					parents = make(map[string]struct{})
				}
				for _, p := range op.parents {
					parents[p] = struct{}{}
				}
			}
		}
		batch := s.queued[:n:n]
		s.queued = s.queued[n:]
		if n == 0 {
			s.queued = nil
			s.flights--
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		s.send(batch)
	}
}

// send runs batch's operations and closes their done channels.
func (s *session) send(batch []*groupOp) {
	defer func() {
		for _, op := range batch {
			close(op.done)
		}
	}()
	for left := batch; len(left) > 0; {
		if len(left) == 1 {
			op := left[0]
			if d, ok := op.reqs[0].(*zk.DeleteRequest); ok && len(op.reqs) == 1 {
				op.err = s.conn.Delete(d.Path, d.Version)
				return
			}
			op.res, op.err = s.conn.Multi(op.reqs...)
			return
		}
		var reqs []any
		for _, op := range left {
			reqs = append(reqs, op.reqs...)
		}
		res, err := s.conn.Multi(reqs...)
		failed := -1 // the operation that failed the multi-op: the first with an error
		for i, r := range res {
			if r.Error != nil {
				failed = i
				break
			}
		}
		if failed < 0 {
			// Done, or in doubt, or not sent: for each alike.
			for _, op := range left {
				op.err = err
				if err == nil && len(res) >= len(op.reqs) {
					op.res, res = res[:len(op.reqs):len(op.reqs)], res[len(op.reqs):]
				}
			}
			return
		}
		if err == nil {
			err = res[failed].Error // not seen: the reply carries its first op's error
		}
		// The failing caller gets the error; the others were rolled back,
		// and go again without it.
		if failed >= len(reqs) {
			for _, op := range left {
				op.err = err
			}
			return
		}
		for i, op := range left {
			if failed < len(op.reqs) {
				op.err = err
				left = append(left[:i:i], left[i+1:]...)
				break
			}
			failed -= len(op.reqs)
		}
	}
}

// sharesParent reports whether any of ps is in parents.
func sharesParent(parents map[string]struct{}, ps []string) bool {
	for _, p := range ps {
		if _, ok := parents[p]; ok {
			return true
		}
	}
	return false
}
