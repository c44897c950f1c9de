package idemhttp_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem/idemhttp"
)

// TestTelemetry: the middleware's span per guarded request, with idem.Do's span inside it, and
// Do's metrics on the Config's meter provider.
func TestTelemetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(ctx); _ = mp.Shutdown(ctx) })
	h := b.middleware(t, &idemhttp.Config{TracerProvider: tp, MeterProvider: mp})(http.HandlerFunc(b.create))

	require.Equal(t, http.StatusCreated, serve(h, request("POST", "/effects", "secret-key", `{"a":1}`)).Code)
	require.Equal(t, http.StatusCreated, serve(h, request("POST", "/effects", "secret-key", `{"a":1}`)).Code)

	var outcomes []string
	for _, s := range spans.GetSpans() {
		for _, kv := range s.Attributes {
			require.NotContains(t, kv.Value.String(), "secret-key", "keys are never recorded")
		}
		if s.Name != "idemhttp.request" {
			continue
		}
		set := attribute.NewSet(s.Attributes...)
		outcome, _ := set.Value("idem.outcome")
		status, _ := set.Value("http.response.status_code")
		replayed, _ := set.Value("idem.replayed")
		outcomes = append(outcomes, outcome.AsString())
		require.EqualValues(t, http.StatusCreated, status.AsInt64())
		require.Equal(t, outcome.AsString() == "replay", replayed.AsBool())

		var do int
		for _, c := range spans.GetSpans() {
			if c.Name == "idem.Do" && c.Parent.SpanID() == s.SpanContext.SpanID() {
				do++
			}
		}
		require.Equal(t, 1, do, "idem.Do's span sits inside the request's")
	}
	require.Equal(t, []string{"run", "replay"}, outcomes)

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
	require.Equal(t, map[string]int64{"run": 1, "replay": 1}, counts, "Do's metrics go to Config.MeterProvider")
}
