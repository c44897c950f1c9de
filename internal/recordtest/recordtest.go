// Package recordtest captures everything idem records, for tests that hold idem to its promise
// about keys (see internal/redact): every span with its attributes, events, links and status,
// every metric point with its attributes, and every log record at debug level with all its
// attributes, as text that a test searches for key IDs.
package recordtest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Capture holds the providers and the logger to give idem, and what they received.
//
//	c := recordtest.New(t)
//	_, err := idem.Run(ctx, pool, key, fn, idem.TracerProvider(c.TP), idem.MeterProvider(c.MP))
//	c.RequireAbsent(t, key.ID)
type Capture struct {
	TP     *sdktrace.TracerProvider
	MP     *sdkmetric.MeterProvider
	Logger *slog.Logger // JSON records at debug level and above

	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	logs   buffer
}

// New returns a Capture whose providers are shut down when the test ends.
func New(t testing.TB) *Capture {
	c := &Capture{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	c.TP = sdktrace.NewTracerProvider(sdktrace.WithSyncer(c.spans))
	c.MP = sdkmetric.NewMeterProvider(sdkmetric.WithReader(c.reader))
	c.Logger = slog.New(slog.NewJSONHandler(&c.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		_ = c.TP.Shutdown(context.Background())
		_ = c.MP.Shutdown(context.Background())
	})
	return c
}

// Records collects the metrics and returns every record captured so far, one text each: a span
// (name, attributes, events with theirs, links' attributes, status), a metric point (its
// instrument and attributes) or a log record (as JSON).
func (c *Capture) Records(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, s := range c.spans.GetSpans() {
		var b strings.Builder
		fmt.Fprintf(&b, "span %s status=%s %q", s.Name, s.Status.Code, s.Status.Description)
		for _, a := range s.Attributes {
			fmt.Fprintf(&b, " %s=%q", a.Key, a.Value.String())
		}
		for _, e := range s.Events {
			fmt.Fprintf(&b, " | event %s", e.Name)
			for _, a := range e.Attributes {
				fmt.Fprintf(&b, " %s=%q", a.Key, a.Value.String())
			}
		}
		for _, l := range s.Links {
			for _, a := range l.Attributes {
				fmt.Fprintf(&b, " | link %s=%q", a.Key, a.Value.String())
			}
		}
		out = append(out, b.String())
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, c.reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			for _, attrs := range pointAttributes(m.Data) {
				out = append(out, "metric "+m.Name+" "+attrs)
			}
		}
	}
	for _, line := range strings.Split(c.logs.String(), "\n") {
		if line != "" {
			out = append(out, "log "+line)
		}
	}
	return out
}

// pointAttributes returns the attributes of each point of a metric, as text.
func pointAttributes(data metricdata.Aggregation) []string {
	var sets []attribute.Set
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		sets = attributeSets(d.DataPoints, func(p metricdata.DataPoint[int64]) attribute.Set { return p.Attributes })
	case metricdata.Sum[float64]:
		sets = attributeSets(d.DataPoints, func(p metricdata.DataPoint[float64]) attribute.Set { return p.Attributes })
	case metricdata.Gauge[int64]:
		sets = attributeSets(d.DataPoints, func(p metricdata.DataPoint[int64]) attribute.Set { return p.Attributes })
	case metricdata.Gauge[float64]:
		sets = attributeSets(d.DataPoints, func(p metricdata.DataPoint[float64]) attribute.Set { return p.Attributes })
	case metricdata.Histogram[int64]:
		sets = attributeSets(d.DataPoints, func(p metricdata.HistogramDataPoint[int64]) attribute.Set { return p.Attributes })
	case metricdata.Histogram[float64]:
		sets = attributeSets(d.DataPoints, func(p metricdata.HistogramDataPoint[float64]) attribute.Set { return p.Attributes })
	default:
		return []string{fmt.Sprintf("%#v", data)} // a kind idem does not make yet: all of it
	}
	out := make([]string, len(sets))
	for i, set := range sets {
		out[i] = set.Encoded(attribute.DefaultEncoder())
	}
	return out
}

func attributeSets[P any](points []P, set func(P) attribute.Set) []attribute.Set {
	out := make([]attribute.Set, len(points))
	for i, p := range points {
		out[i] = set(p)
	}
	return out
}

// RequireAbsent fails the test when any record contains one of ids, naming the record.
func (c *Capture) RequireAbsent(t testing.TB, ids ...string) {
	t.Helper()
	records := c.Records(t)
	require.NotEmpty(t, records)
	for _, r := range records {
		for _, id := range ids {
			require.NotContains(t, r, id, "a record carries key %q", id)
		}
	}
}

// buffer is a bytes.Buffer that several goroutines log to.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
