package dlockotel

import (
	"errors"
	"time"

	"github.com/dlock/dlock"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Options configure the hook. A nil *Options means all defaults.
type Options struct {
	// MeterProvider and TracerProvider default to OpenTelemetry's global
	// ones (otel.GetMeterProvider, otel.GetTracerProvider).
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
	// Backend is the dlock.backend attribute ("redis", "etcd"…), "" for
	// none.
	Backend string
	// WithName adds the lock name (dlock.lock) to every metric; spans always
	// carry it.
	WithName bool
}

const scope = "github.com/dlock/dlock/otel"

// Hook returns the function to set as dlock.Observer.Hook.
func Hook(opts *Options) (func(dlock.Event), error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	m := o.MeterProvider.Meter(scope)
	h := &hook{o: o, tracer: o.TracerProvider.Tracer(scope)}
	var errs []error
	record := func(err error) { errs = append(errs, err) }
	var err error
	h.duration, err = m.Float64Histogram("dlock.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("How long Acquire and TryAcquire took, by outcome."))
	record(err)
	h.wait, err = m.Float64Histogram("dlock.acquire.wait", metric.WithUnit("s"),
		metric.WithDescription("How long granted acquisitions waited."))
	record(err)
	h.hold, err = m.Float64Histogram("dlock.lease.hold", metric.WithUnit("s"),
		metric.WithDescription("How long leases were held, by how they ended."))
	record(err)
	h.held, err = m.Int64UpDownCounter("dlock.leases.held", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held now."))
	record(err)
	h.losses, err = m.Int64Counter("dlock.lease.losses", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases lost."))
	record(err)
	h.refreshFailures, err = m.Int64Counter("dlock.refresh.failures", metric.WithUnit("{refresh}"),
		metric.WithDescription("Watchdog refreshes that failed and were retried."))
	record(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return h.event, nil
}

type hook struct {
	o                       Options
	tracer                  trace.Tracer
	duration, wait, hold    metric.Float64Histogram
	held                    metric.Int64UpDownCounter
	losses, refreshFailures metric.Int64Counter
}

func (h *hook) attrs(ev dlock.Event, extra ...attribute.KeyValue) metric.MeasurementOption {
	kv := make([]attribute.KeyValue, 0, 3+len(extra))
	if h.o.Backend != "" {
		kv = append(kv, attribute.String("dlock.backend", h.o.Backend))
	}
	if h.o.WithName {
		kv = append(kv, attribute.String("dlock.lock", ev.Name))
	}
	kv = append(kv, extra...)
	return metric.WithAttributeSet(attribute.NewSet(kv...))
}

func outcome(s string) attribute.KeyValue { return attribute.String("dlock.outcome", s) }

func (h *hook) event(ev dlock.Event) {
	ctx := ev.Context
	now := time.Now()
	switch ev.Kind {
	case dlock.EventAcquired:
		h.duration.Record(ctx, ev.Duration.Seconds(), h.attrs(ev, outcome("acquired")))
		h.wait.Record(ctx, ev.Duration.Seconds(), h.attrs(ev))
		h.held.Add(ctx, 1, h.attrs(ev))
		h.span(ev, "dlock.acquire", now)
	case dlock.EventAcquireFailed:
		out := "error"
		if errors.Is(ev.Err, dlock.ErrNotAcquired) {
			out = "not_acquired"
		}
		h.duration.Record(ctx, ev.Duration.Seconds(), h.attrs(ev, outcome(out)))
		h.span(ev, "dlock.acquire", now)
	case dlock.EventReleased:
		h.hold.Record(ctx, ev.Held.Seconds(), h.attrs(ev, outcome("released")))
		h.held.Add(ctx, -1, h.attrs(ev))
		h.span(ev, "dlock.release", now)
	case dlock.EventLost:
		h.hold.Record(ctx, ev.Held.Seconds(), h.attrs(ev, outcome("lost")))
		h.held.Add(ctx, -1, h.attrs(ev))
		h.losses.Add(ctx, 1, h.attrs(ev))
		h.span(ev, "dlock.lost", now)
	case dlock.EventRefreshFailed:
		h.refreshFailures.Add(ctx, 1, h.attrs(ev))
	}
}

// span records the operation that ended now and took ev.Duration.
func (h *hook) span(ev dlock.Event, name string, now time.Time) {
	kv := []attribute.KeyValue{attribute.String("dlock.lock", ev.Name)}
	if h.o.Backend != "" {
		kv = append(kv, attribute.String("dlock.backend", h.o.Backend))
	}
	if ev.Fence != 0 {
		kv = append(kv, attribute.Int64("dlock.fence", int64(ev.Fence)))
	}
	_, sp := h.tracer.Start(ev.Context, name, trace.WithTimestamp(now.Add(-ev.Duration)), trace.WithAttributes(kv...))
	if ev.Err != nil {
		sp.RecordError(ev.Err)
		sp.SetStatus(codes.Error, ev.Err.Error())
	}
	sp.End(trace.WithTimestamp(now))
}
