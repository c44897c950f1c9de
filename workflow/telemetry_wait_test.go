package workflow_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
)

// TestWakeSpanJoinsTheRunsTrace checks that the part of a run done after a sleep, in a River
// job, sits in the trace of the call that started the run, as a resume after a crash does.
func TestWakeSpanJoinsTheRunsTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(b.ctx) })
	wf := newSleeper()
	cfg := fastConfig(wf)
	cfg.TracerProvider = tp
	e := b.engine(t, cfg)
	b.startRiver(t, e)

	ctx, parent := tp.Tracer("test").Start(b.ctx, "handler")
	_, err := wf.Run(ctx, e, waitKey("traced"), 200, nil)
	require.ErrorIs(t, err, idem.ErrInFlight)
	parent.End()
	require.Equal(t, "done", b.waitFinished(t, waitKey("traced")))

	var woken *tracetest.SpanStub
	eventually(t, 5*time.Second, "the wake-up's span to end", func() bool {
		for _, s := range spans.GetSpans() {
			if s.Name == "idem.workflow.resume" && attr(s, "idem.wake") == "timer" {
				woken = &s
				return true
			}
		}
		return false
	})
	require.Equal(t, parent.SpanContext().TraceID(), woken.SpanContext.TraceID())
	require.Equal(t, "done", attr(*woken, "idem.outcome"))
}
