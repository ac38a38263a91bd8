package dlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// nopDriver grants every attempt at once; its handles do nothing. What an
// acquire+release through it costs is the engine's own share of a cycle.
type nopDriver struct{}

func (nopDriver) Capabilities() dlock.Capabilities { return dlock.Capabilities{Fencing: true} }
func (nopDriver) Close() error                     { return nil }

func (nopDriver) TryAcquire(ctx context.Context, req driver.Request) (*driver.Grant, error) {
	return &driver.Grant{Handle: nopHandle{}, Fence: 1}, nil
}

type nopHandle struct{}

func (nopHandle) Refresh(context.Context, time.Duration) (time.Duration, error) { return 0, nil }
func (nopHandle) Release(context.Context) error                                 { return nil }
func (nopHandle) Held(context.Context) (bool, error)                            { return true, nil }

// BenchmarkEngine is TryAcquire then Release, default options (the
// watchdog on), on a driver that answers at once: the root engine's CPU
// and allocations per uncontended cycle, which every driver pays on top of
// its own. ctx is context.Background(), or one that can be cancelled (as a
// program's signal.NotifyContext, or a request's context).
//
//	go test -run '^$' -bench Engine -benchmem .
func BenchmarkEngine(b *testing.B) {
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{
		{"background", context.Background()},
		{"cancellable", cancellable},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l, err := dlock.New(nopDriver{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close(context.Background())
			ctx := bc.ctx
			b.ReportAllocs()
			for b.Loop() {
				ls, err := l.TryAcquire(ctx, "bench", nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := ls.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Done is made on its first call: asked before the lease ends it is the
// same channel every time and closed by the end; asked only afterwards it
// is closed already.
func TestDoneMadeOnDemand(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.New(nopDriver{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	before, err := l.TryAcquire(ctx, "before", nil)
	if err != nil {
		t.Fatal(err)
	}
	d := before.Done()
	if d2 := before.Done(); d2 != d {
		t.Fatalf("Done returned %v, then %v: want one channel", d, d2)
	}
	select {
	case <-d:
		t.Fatal("Done closed while the lease is held")
	default:
	}
	if err := before.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d:
	default:
		t.Fatal("Done not closed by Release")
	}
	after, err := l.TryAcquire(ctx, "after", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := after.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-after.Done():
	default:
		t.Fatal("Done first asked after Release: not closed")
	}
	if after.Err() == nil || after.Context().Err() == nil {
		t.Fatalf("after Release: Err %v, Context().Err() %v; want both set", after.Err(), after.Context().Err())
	}
}
