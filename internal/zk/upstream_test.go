package zk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	upstream "github.com/go-zookeeper/zk"
)

// TestAliasedWire: the request and reply types this copy takes from
// upstream (upstream.go) go through its reflection-based encoding as its own
// did: field by field, in declaration order.
func TestAliasedWire(t *testing.T) {
	// A create request laid out by hand: path, data, ACLs, flags.
	var want []byte
	str := func(s string) {
		want = binary.BigEndian.AppendUint32(want, uint32(len(s)))
		want = append(want, s...)
	}
	str("/a")
	str("xy")
	want = binary.BigEndian.AppendUint32(want, 1)
	want = binary.BigEndian.AppendUint32(want, PermAll)
	str("world")
	str("anyone")
	want = binary.BigEndian.AppendUint32(want, FlagEphemeral)

	buf := make([]byte, 256)
	req := &upstream.CreateRequest{Path: "/a", Data: []byte("xy"), Acl: upstream.WorldACL(upstream.PermAll), Flags: upstream.FlagEphemeral}
	n, err := encodePacket(buf, req)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("encoded %x, want %x", buf[:n], want)
	}

	// Every aliased request type of a multi-op survives the round trip.
	ops := []any{
		req,
		&upstream.SetDataRequest{Path: "/b", Data: []byte{1}, Version: 3},
		&upstream.DeleteRequest{Path: "/c", Version: -1},
		&upstream.CheckVersionRequest{Path: "/d", Version: 7},
	}
	codes := []int32{opCreate, opSetData, opDelete, opCheck}
	mr := &multiRequest{DoneHeader: multiHeader{Type: -1, Done: true, Err: -1}}
	for i, op := range ops {
		mr.Ops = append(mr.Ops, multiRequestOp{Header: multiHeader{Type: codes[i], Done: false, Err: -1}, Op: op})
	}
	n, err = encodePacket(buf, mr)
	if err != nil {
		t.Fatal(err)
	}
	var got multiRequest
	if _, err := decodePacket(buf[:n], &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Ops) != len(ops) {
		t.Fatalf("decoded %d ops, want %d", len(got.Ops), len(ops))
	}
	for i, op := range got.Ops {
		if !reflect.DeepEqual(op.Op, ops[i]) {
			t.Errorf("op %d: got %#v, want %#v", i, op.Op, ops[i])
		}
	}

	// A reply's Stat decodes into upstream's type.
	st := upstream.Stat{Czxid: 1, Mzxid: 2, Ctime: 3, Mtime: 4, Version: 5, Cversion: 6, Aversion: 7, EphemeralOwner: 8, DataLength: 9, NumChildren: 10, Pzxid: 11}
	n, err = encodePacket(buf, &statResponse{Stat: st})
	if err != nil {
		t.Fatal(err)
	}
	var sr existsResponse
	if _, err := decodePacket(buf[:n], &sr); err != nil {
		t.Fatal(err)
	}
	if sr.Stat != st {
		t.Fatalf("decoded %+v, want %+v", sr.Stat, st)
	}
}

// TestAliasedErrors: the server's error codes map to upstream's error values.
func TestAliasedErrors(t *testing.T) {
	for code, want := range map[ErrCode]error{errNoNode: upstream.ErrNoNode, errNodeExists: upstream.ErrNodeExists, errBadVersion: upstream.ErrBadVersion, errSessionExpired: upstream.ErrSessionExpired} {
		if err := code.toError(); !errors.Is(err, want) {
			t.Errorf("code %d: got %v, want %v", code, err, want)
		}
	}
}
