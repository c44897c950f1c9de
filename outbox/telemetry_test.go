package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/outboxcheck"
	"github.com/idemkit/idem/outbox"
)

// TestTelemetry checks a span per published batch and the relay's metrics: published and failed
// counts by topic, the key stopped, and the lag of each lane it owns.
func TestTelemetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	release := make(chan struct{})
	pub := outbox.PublisherFunc(func(ctx context.Context, e *outbox.Envelope) error {
		if e.Topic == "slow" {
			<-release
		}
		if e.Topic == "bad" {
			return errors.New("refused")
		}
		return nil
	})
	opts := b.opts("r1")
	opts.TracerProvider, opts.MeterProvider = tp, mp
	opts.Failure.MaxAttempts = 2
	opts.Lanes = 1
	b.run(t, pub, opts)

	good := &outboxcheck.Writer{DB: b.pool, Topic: "good", Keys: 3}
	_, err := good.Write(b.ctx, 5)
	require.NoError(t, err)
	bad := &outboxcheck.Writer{DB: b.pool, Topic: "bad", Keys: 1}
	_, err = bad.Write(b.ctx, 1)
	require.NoError(t, err)
	b.waitPublished(t, 5)
	waitFor(t, 10*time.Second, "the key to stop", func() bool { return b.counts(t)[outbox.StatusStopped] == 1 })
	slow := &outboxcheck.Writer{DB: b.pool, Topic: "slow", Keys: 1}
	_, err = slow.Write(b.ctx, 1)
	require.NoError(t, err)

	var rm metricdata.ResourceMetrics
	sums := map[string]map[string]int64{}
	var lag float64
	waitFor(t, 10*time.Second, "a lag to show", func() bool {
		require.NoError(t, reader.Collect(b.ctx, &rm))
		lag = 0
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Sum[int64]:
					sums[m.Name] = map[string]int64{}
					for _, p := range d.DataPoints {
						topic, _ := p.Attributes.Value("idem.outbox.topic")
						sums[m.Name][topic.AsString()] += p.Value
					}
				case metricdata.Gauge[float64]:
					for _, p := range d.DataPoints {
						lag = max(lag, p.Value)
					}
				}
			}
		}
		return lag > 0.2 // the slow message, and the stopped key, wait
	})
	close(release)
	require.EqualValues(t, 5, sums["idem.outbox.published"]["good"])
	require.EqualValues(t, 2, sums["idem.outbox.failed"]["bad"])
	require.EqualValues(t, 1, sums["idem.outbox.stopped"]["bad"])

	batches := 0
	for _, s := range spans.Ended() {
		if s.Name() == "idem.outbox.publish" {
			batches++
		}
	}
	require.GreaterOrEqual(t, batches, 3, "a span per batch: the good messages, and each attempt of the bad one")
}

// TestReap checks that idem.Reap deletes published messages past the retention, and leaves the
// others.
func TestReap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.run(t, b.sink(), b.opts("r1"))
	w := &outboxcheck.Writer{DB: b.pool, Topic: "t", Keys: 3}
	_, err := w.Write(b.ctx, 10)
	require.NoError(t, err)
	b.waitPublished(t, 10)
	n, err := idem.Reap(b.ctx, b.pool)
	require.NoError(t, err)
	require.Zero(t, n, "within the default retention")
	time.Sleep(1100 * time.Millisecond)
	n, err = idem.Reap(b.ctx, b.pool, idem.OutboxRetention(time.Second))
	require.NoError(t, err)
	require.EqualValues(t, 10, n)
	require.Empty(t, b.counts(t))
	_, err = idem.Reap(b.ctx, b.pool, idem.OutboxRetention(time.Millisecond))
	require.ErrorContains(t, err, "OutboxRetention cannot be less than one second")
}
