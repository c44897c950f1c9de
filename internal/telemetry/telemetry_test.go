package telemetry

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkDoOverhead is what idem.Do adds for telemetry when the application has installed no
// SDK (the global providers): a span started and ended, a counter and a histogram recorded.
// Compare it with a Do's cost in BenchmarkTransfer (cpu-µs/tx, some hundreds of µs).
//
//	go test -run '^$' -bench DoOverhead -benchmem ./internal/telemetry/
func BenchmarkDoOverhead(b *testing.B) {
	ctx := context.Background()
	set := metric.WithAttributeSet(attribute.NewSet(Outcome.String("run")))
	b.ReportAllocs()
	for range b.N {
		tel := For(nil, nil)
		start := time.Now()
		sctx, span := tel.Tracer.Start(ctx, "idem.Do", trace.WithSpanKind(trace.SpanKindInternal))
		tel.DoOutcomes.Add(sctx, 1, set)
		tel.DoDuration.Record(sctx, time.Since(start).Seconds(), set)
		if span.IsRecording() {
			span.SetAttributes(Outcome.String("run"), Scope.String("tenant"))
		}
		span.End()
	}
}

func TestForIsCached(t *testing.T) {
	first, second := For(nil, nil), For(nil, nil)
	if first != second {
		t.Fatal("For must return the same set for the same providers")
	}
}
