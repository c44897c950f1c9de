package outbox

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/telemetry"
)

// Attribute keys of the relay's spans and metrics.
const (
	attrTopic = attribute.Key("idem.outbox.topic")
	attrLane  = attribute.Key("idem.outbox.lane")
	attrRelay = attribute.Key("idem.outbox.relay")
)

// relayTelemetry is a relay's tracer and instruments.
type relayTelemetry struct {
	tracer                           trace.Tracer
	meter                            metric.Meter
	published, failed, dead, stopped metric.Int64Counter
	lag                              metric.Float64ObservableGauge

	mu   sync.Mutex
	lags map[*loop]map[int32]time.Duration
}

func newRelayTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) *relayTelemetry {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &relayTelemetry{tracer: tp.Tracer(telemetry.ScopeName), meter: mp.Meter(telemetry.ScopeName), lags: map[*loop]map[int32]time.Duration{}}
	// Instrument errors only come from invalid names; these are constants, and the no-op
	// instruments returned beside an error work.
	t.published, _ = t.meter.Int64Counter("idem.outbox.published", metric.WithDescription("Messages the broker acknowledged, by topic."))
	t.failed, _ = t.meter.Int64Counter("idem.outbox.failed", metric.WithDescription("Publish attempts the broker refused, by topic."))
	t.dead, _ = t.meter.Int64Counter("idem.outbox.dead_lettered", metric.WithDescription("Messages set aside after their last attempt, by topic."))
	t.stopped, _ = t.meter.Int64Counter("idem.outbox.stopped", metric.WithDescription("Keys stopped after their message's last attempt, by topic."))
	t.lag, _ = t.meter.Float64ObservableGauge("idem.outbox.lag", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message not yet published that the relay holds, by lane it owns (0 when none)."))
	return t
}

func (t *relayTelemetry) count(ctx context.Context, c metric.Int64Counter, topic string) {
	c.Add(ctx, 1, metric.WithAttributes(attrTopic.String(topic)))
}

func (t *relayTelemetry) setLag(l *loop, lags map[int32]time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lags[l] = lags
}

// observeLag reports l's lag per lane at each collection, until the returned function is called.
func (t *relayTelemetry) observeLag(l *loop) func() {
	reg, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		t.mu.Lock()
		defer t.mu.Unlock()
		for lane, lag := range t.lags[l] {
			o.ObserveFloat64(t.lag, lag.Seconds(), metric.WithAttributes(attrLane.Int(int(lane)), attrRelay.String(l.r.cfg.Name)))
		}
		return nil
	}, t.lag)
	return func() {
		if err == nil {
			_ = reg.Unregister()
		}
		t.mu.Lock()
		delete(t.lags, l)
		t.mu.Unlock()
	}
}
