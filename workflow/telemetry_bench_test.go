package workflow

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/telemetry"
)

// BenchmarkStepTelemetry is what one step of a run adds for telemetry when the application has
// installed no SDK (the global providers): its span, and one attempt's counter and histogram.
// Compare it with a step's cost in BenchmarkThreeSteps (hundreds of µs).
//
//	go test -run '^$' -bench StepTelemetry -benchmem ./workflow/
func BenchmarkStepTelemetry(b *testing.B) {
	e := &Engine{tel: telemetry.For(nil, nil)}
	ctx := context.Background()
	b.ReportAllocs()
	for range b.N {
		sctx, span := e.startStep(ctx, redact.Key{Scope: "merchant:7", ID: "payout-1"}, "transfer", "tx", "reserve", 1, false)
		span.attempt(sctx, time.Now(), "ok")
		span.end(1, nil)
	}
}
