package dlockotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/memory"
	dlockotel "github.com/dlock/dlock/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// One acquisition, one refused TryAcquire, one release and one loss (the
// memory driver's link partitioned) give the counts, sums and spans they
// should.
func TestHook(t *testing.T) {
	ctx := t.Context()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) })
	hook, err := dlockotel.Hook(&dlockotel.Options{MeterProvider: mp, TracerProvider: tp, Backend: "mem"})
	if err != nil {
		t.Fatal(err)
	}
	link := memory.NewLink()
	l, err := memory.New(memory.NewStore(), &memory.Options{Link: link})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	lost := make(chan struct{})
	l.SetObserver(dlock.Observer{Hook: func(ev dlock.Event) {
		hook(ev)
		if ev.Kind == dlock.EventLost {
			close(lost)
		}
	}})

	ls, err := l.Acquire(ctx, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "a", nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "b", &dlock.Options{TTL: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	link.Blackhole()
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("no loss within 10s")
	}
	link.Heal()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m.Data
		}
	}
	outcomes := func(name string) map[string]uint64 {
		h, ok := got[name].(metricdata.Histogram[float64])
		if !ok {
			t.Fatalf("%s: %T, want a histogram", name, got[name])
		}
		c := map[string]uint64{}
		for _, p := range h.DataPoints {
			if b, _ := p.Attributes.Value("dlock.backend"); b.AsString() != "mem" {
				t.Errorf("%s without dlock.backend=mem: %v", name, p.Attributes)
			}
			o, _ := p.Attributes.Value(attribute.Key("dlock.outcome"))
			c[o.AsString()] += p.Count
		}
		return c
	}
	if c := outcomes("dlock.acquire.duration"); c["acquired"] != 2 || c["not_acquired"] != 1 || len(c) != 2 {
		t.Errorf("dlock.acquire.duration counts %v, want 2 acquired and 1 not_acquired", c)
	}
	if c := outcomes("dlock.acquire.wait"); c[""] != 2 {
		t.Errorf("dlock.acquire.wait counts %v, want 2", c)
	}
	if c := outcomes("dlock.lease.hold"); c["released"] != 1 || c["lost"] != 1 {
		t.Errorf("dlock.lease.hold counts %v, want 1 released and 1 lost", c)
	}
	sum := func(name string) int64 {
		s, ok := got[name].(metricdata.Sum[int64])
		if !ok {
			t.Fatalf("%s: %T, want a sum", name, got[name])
		}
		var v int64
		for _, p := range s.DataPoints {
			v += p.Value
		}
		return v
	}
	if v := sum("dlock.leases.held"); v != 0 {
		t.Errorf("dlock.leases.held = %d after a release and a loss, want 0", v)
	}
	if v := sum("dlock.lease.losses"); v != 1 {
		t.Errorf("dlock.lease.losses = %d, want 1", v)
	}

	names := map[string]int{}
	var refused bool
	for _, s := range spans.Ended() {
		names[s.Name()]++
		if s.Name() == "dlock.acquire" && s.Status().Code == codes.Error {
			refused = true
		}
		if s.EndTime().Before(s.StartTime()) {
			t.Errorf("span %s ends before it starts", s.Name())
		}
	}
	if names["dlock.acquire"] != 3 || names["dlock.release"] != 1 || names["dlock.lost"] != 1 || !refused {
		t.Errorf("spans %v (an error acquire: %v), want 3 dlock.acquire (one an error), 1 dlock.release, 1 dlock.lost", names, refused)
	}
}
