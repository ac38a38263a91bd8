package memory_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/conformance"
	"github.com/dlock/dlock/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type harness struct{ store *memory.Store }

func (h harness) NewLocker(t testing.TB, defaults *dlock.Options) (*dlock.Locker, conformance.Faults) {
	link := memory.NewLink()
	o := &memory.Options{Link: link}
	if defaults != nil {
		o.Defaults = *defaults
	}
	l, err := memory.New(h.store, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, link
}

func (h harness) Residue(_ context.Context, name string) ([]string, error) {
	return h.store.Residue(name), nil
}

func TestConformance(t *testing.T) {
	conformance.RunConfig(t, harness{memory.NewStore()}, conformance.Config{TTL: 300 * time.Millisecond})
}

func BenchmarkConformance(b *testing.B) {
	conformance.Benchmark(b, harness{memory.NewStore()})
}
