package mysqlqueue

import (
	"database/sql"
	"testing"
	"time"
)

// The wait counts from the statement's now to the earlier of the next due
// time and claim deadline; nothing queued is -1, and stays -1 counted from
// the caller's clock.
func TestNextWait(t *testing.T) {
	v := func(ms int64) sql.NullInt64 { return sql.NullInt64{Int64: ms, Valid: true} }
	for _, tc := range []struct {
		n                next
		want             time.Duration
		waiting, expired bool
	}{
		{next{nowUS: 5_000_000}, -1, false, false},
		{next{waiting: v(5_010), nowUS: 5_000_000}, 10 * time.Millisecond, false, false},
		{next{waiting: v(5_010), claimed: v(5_003), nowUS: 5_000_500}, 2500 * time.Microsecond, false, false},
		{next{waiting: v(5_000), nowUS: 5_000_000}, 0, true, false},
		{next{claimed: v(5_001), nowUS: 5_000_999}, time.Microsecond, false, false},
		{next{claimed: v(4_999), nowUS: 5_000_000}, 0, false, true},
	} {
		if got := tc.n.wait(); got != tc.want {
			t.Errorf("%+v: wait %v, want %v", tc.n, got, tc.want)
		}
		if w, e := tc.n.due(); w != tc.waiting || e != tc.expired {
			t.Errorf("%+v: due %v, %v; want %v, %v", tc.n, w, e, tc.waiting, tc.expired)
		}
	}
	if got := untilDue(-1, time.Now().Add(-time.Second)); got != -1 {
		t.Errorf("untilDue(-1): %v, want -1 (none queued)", got)
	}
	if got := untilDue(time.Millisecond, time.Now().Add(-time.Second)); got != 0 {
		t.Errorf("untilDue of a wait already over: %v, want 0", got)
	}
}

func TestMarks(t *testing.T) {
	for n, want := range map[int]string{1: "?", 3: "?, ?, ?"} {
		if got := marks(n); got != want {
			t.Errorf("marks(%d) = %q, want %q", n, got, want)
		}
	}
}
