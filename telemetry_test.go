package idem_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
)

// TestTelemetry records Do's spans and metrics with the SDK's in-memory exporter and manual
// reader: one span per call with its outcome and scope (and never the key), and the counts by
// outcome.
func TestTelemetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(ctx); _ = mp.Shutdown(ctx) })
	opts := []idem.Option{idem.TracerProvider(tp), idem.MeterProvider(mp)}

	k := idem.Key{Scope: "tenant-a", ID: "secret-looking-key", Fingerprint: idem.Fingerprint("a")}
	_, err := idem.Run(ctx, b.pool, k, recordEffect("t", "x", nil), opts...)
	require.NoError(t, err)
	_, err = idem.Run(ctx, b.pool, k, recordEffect("t", "x", nil), opts...)
	require.NoError(t, err)
	other := k
	other.Fingerprint = idem.Fingerprint("b")
	_, err = idem.Run(ctx, b.pool, other, recordEffect("t", "x", nil), opts...)
	require.ErrorIs(t, err, idem.ErrMismatch)
	// In flight: a transaction holds the key.
	holder, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	busy := idem.Key{Scope: "tenant-a", ID: "busy"}
	_, err = idem.Do(ctx, holder, busy, recordEffect("busy", "x", nil))
	require.NoError(t, err)
	err = b.inTx(t, pgx.TxOptions{}, func(tx pgx.Tx) error {
		_, err := idem.Do(ctx, tx, busy, recordEffect("busy", "y", nil), opts...)
		return err
	})
	require.ErrorIs(t, err, idem.ErrInFlight)

	var outcomes []string
	for _, s := range spans.GetSpans() {
		attrs := attribute.NewSet(s.Attributes...)
		for _, kv := range s.Attributes {
			require.NotContains(t, kv.Value.String(), "secret-looking-key", "keys are never recorded")
		}
		if s.Name != "idem.Do" {
			continue
		}
		v, _ := attrs.Value("idem.outcome")
		outcomes = append(outcomes, v.AsString())
		scope, _ := attrs.Value("idem.scope")
		require.Equal(t, "tenant-a", scope.AsString())
	}
	require.Equal(t, []string{"run", "replay", "mismatch", "in_flight"}, outcomes)
	var runSpans int
	for _, s := range spans.GetSpans() {
		if s.Name == "idem.Run" {
			runSpans++
		}
	}
	require.Equal(t, 3, runSpans)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "idem.do.outcomes" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value("idem.outcome")
				counts[v.AsString()] += dp.Value
			}
		}
	}
	require.Equal(t, map[string]int64{"run": 1, "replay": 1, "mismatch": 1, "in_flight": 1}, counts)
}

// TestReapTelemetry checks that Reap counts what it deleted in idem.reaped, by kind.
func TestReapTelemetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })
	_, err := b.pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, result, expires_at)
		SELECT 's', 'expired-' || i, '{}', now() - interval '1 second' FROM generate_series(1, 3) i`)
	require.NoError(t, err)
	b.seedRun(t, "s", "run-done-expired", "payout", "done", "now() - interval '1 second'")

	n, err := idem.Reap(ctx, b.pool, idem.ReapBusy(1), idem.MeterProvider(mp))
	require.NoError(t, err)
	require.EqualValues(t, 4, n)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "idem.reaped" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value("idem.what")
				counts[v.AsString()] += dp.Value
			}
		}
	}
	require.Equal(t, map[string]int64{"do": 3, "run": 1, "outbox": 0}, counts)
}
