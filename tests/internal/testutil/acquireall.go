package testutil

import (
	"context"
	"fmt"
	"testing"

	"github.com/dlock/dlock"
)

// BenchTryAcquireAll times l.TryAcquireAll of k free names against k
// TryAcquire calls one after another, for k = 2, 5 and 20, the releases not
// timed; names(k) returns k fresh names.
func BenchTryAcquireAll(b *testing.B, l *dlock.Locker, names func(k int) []string) {
	ctx := context.Background()
	for _, k := range []int{2, 5, 20} {
		names := names(k)
		b.Run(fmt.Sprintf("all/k=%d", k), func(b *testing.B) {
			for b.Loop() {
				ls, err := l.TryAcquireAll(ctx, names, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := ls.Release(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("singles/k=%d", k), func(b *testing.B) {
			held := make([]*dlock.Lease, k)
			for b.Loop() {
				for i, n := range names {
					var err error
					if held[i], err = l.TryAcquire(ctx, n, nil); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				for _, ls := range held {
					if err := ls.Release(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
			}
		})
	}
}
