package workflow_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
)

// TestTelemetry follows one run through a crash: an HTTP request (traced by otelhttp, as an
// application would) starts a transfer whose process dies after its first step; River resumes
// it. The resumed part must land in the request's trace, under the span that started the run,
// and the metrics must count what really ran.
func TestTelemetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(ctx); _ = mp.Shutdown(ctx) })

	h := &hooks{}
	wf := newTransfer(b.pool, h)
	cfg := fastConfig(wf)
	cfg.TracerProvider, cfg.MeterProvider = tp, mp
	e := b.engine(t, cfg)
	key := idem.Key{Scope: "merchant:7", ID: "secret-looking-key"}

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runCtx, cancel := context.WithCancel(r.Context())
		defer cancel()
		// The process "dies" during the charge, after the reserve step committed.
		var once sync.Once
		h.mu.Lock()
		h.at = func(_ context.Context, p string) {
			if p == "in:charge" {
				once.Do(cancel)
			}
		}
		h.mu.Unlock()
		_, err := wf.Run(runCtx, e, key, transferReq{Amount: 5, Note: "traced"}, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	srv := httptest.NewServer(otelhttp.NewHandler(handler, "POST /transfers", otelhttp.WithTracerProvider(tp)))
	t.Cleanup(srv.Close)
	res, err := http.Post(srv.URL, "application/json", nil)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)

	// Before the resume the gauge sees the run as running.
	require.Equal(t, map[string]int64{"running": 1}, gauge(t, reader, "idem.workflow.runs"))

	h.mu.Lock()
	h.at = nil
	h.mu.Unlock()
	b.waitLeaseExpired(t, key)
	b.startRiver(t, e)
	require.Equal(t, "done", b.waitFinished(t, key))
	r, err := wf.Run(ctx, e, key, transferReq{Amount: 5, Note: "traced"}, nil)
	require.NoError(t, err)
	b.checkTransfer(t, r)

	byName := map[string][]tracetest.SpanStub{}
	var request tracetest.SpanStub
	for _, s := range spans.GetSpans() {
		byName[s.Name] = append(byName[s.Name], s)
		if s.SpanKind == trace.SpanKindServer {
			request = s
		}
		for _, kv := range s.Attributes {
			require.NotContains(t, kv.Value.String(), key.ID, "keys are never recorded (span %s)", s.Name)
		}
	}
	require.True(t, request.SpanContext.IsValid(), "otelhttp span is missing; spans: %v", keys(byName))
	traceID := request.SpanContext.TraceID()

	// The request's call: a run span under the request, stopped without an outcome.
	runs := byName["idem.workflow.run"]
	require.Len(t, runs, 2, "the request's call and the final replay")
	first := runs[0]
	require.Equal(t, request.SpanContext.SpanID(), first.Parent.SpanID())
	require.Equal(t, "stopped", attr(first, "idem.outcome"))
	require.Equal(t, "transfer", attr(first, "idem.workflow"))
	require.Equal(t, "merchant:7", attr(first, "idem.scope"))
	require.Equal(t, "replay", attr(runs[1], "idem.outcome"))

	// The resume, in River's job, under the span that started the run: same trace.
	resumes := byName["idem.workflow.resume"]
	require.Len(t, resumes, 1)
	resume := resumes[0]
	require.Equal(t, traceID, resume.SpanContext.TraceID(), "the resumed part must join the request's trace")
	require.Equal(t, first.SpanContext.SpanID(), resume.Parent.SpanID())
	require.Equal(t, "done", attr(resume, "idem.outcome"))

	// Steps: reserve and charge ran under the request's run span (the charge's checkpoint was
	// saved as the run stopped); after the crash both are replayed under the resume, and settle
	// runs there. The final call is answered from the stored outcome before any workflow code
	// runs, so it has no step at all.
	type stepSeen struct {
		name, parent string
		replayed     bool
	}
	var seen []stepSeen
	for _, s := range byName["idem.workflow.step"] {
		parent := "?"
		switch s.Parent.SpanID() {
		case first.SpanContext.SpanID():
			parent = "request"
		case resume.SpanContext.SpanID():
			parent = "resume"
		case runs[1].SpanContext.SpanID():
			parent = "replay"
		}
		if parent != "replay" {
			require.Equal(t, traceID, s.SpanContext.TraceID(), "step %s must be in the request's trace", attr(s, "idem.step.name"))
		}
		seen = append(seen, stepSeen{attr(s, "idem.step.name"), parent, attr(s, "idem.replayed") == "true"})
	}
	require.ElementsMatch(t, []stepSeen{
		{"reserve", "request", false}, {"charge", "request", false},
		{"reserve", "resume", true}, {"charge", "resume", true}, {"settle", "resume", false},
	}, seen)

	// Metrics: what ran, not what was replayed.
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	executions := sums(rm, "idem.step.executions", "idem.step.kind", "idem.outcome")
	require.Equal(t, map[string]int64{"tx/ok": 2, "call/ok": 1}, executions)
	require.Equal(t, map[string]int64{"transfer/job": 1}, sums(rm, "idem.workflow.resumes", "idem.workflow", "idem.by"))
	require.Empty(t, gauge(t, reader, "idem.workflow.runs"), "a done run is not counted")
}

// TestTraceparentStoredWithStartTx: a run started with StartTx keeps the starter's trace
// context, and the job that runs it joins that trace.
func TestTraceparentStoredWithStartTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(b.ctx) })
	wf := newTransfer(b.pool, nil)
	cfg := fastConfig(wf)
	cfg.TracerProvider = tp
	e := b.engine(t, cfg)
	b.startRiver(t, e)
	key := idem.Key{Scope: "s", ID: "started"}

	ctx, parent := tp.Tracer("test").Start(b.ctx, "handler")
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, wf.StartTx(ctx, e, tx, key, transferReq{Amount: 1, Note: "bg"}))
	require.NoError(t, tx.Commit(ctx))
	parent.End()

	var stored string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT trace_context FROM idem_runs WHERE id = $1`, key.ID).Scan(&stored))
	require.Contains(t, stored, parent.SpanContext().TraceID().String())
	require.Contains(t, stored, parent.SpanContext().SpanID().String())

	require.Equal(t, "done", b.waitFinished(t, key))
	eventually(t, 5*time.Second, "the resume span to end", func() bool {
		for _, s := range spans.GetSpans() {
			if s.Name == "idem.workflow.resume" {
				return true
			}
		}
		return false
	})
	for _, s := range spans.GetSpans() {
		if s.Name == "idem.workflow.resume" {
			require.Equal(t, parent.SpanContext().TraceID(), s.SpanContext.TraceID())
			require.Equal(t, parent.SpanContext().SpanID(), s.Parent.SpanID())
		}
	}
}

func attr(s tracetest.SpanStub, key string) string {
	set := attribute.NewSet(s.Attributes...)
	v, _ := set.Value(attribute.Key(key))
	return v.String()
}

// sums adds up an int64 counter's points by the values of the given attributes, joined by "/".
func sums(rm metricdata.ResourceMetrics, name string, keys ...string) map[string]int64 {
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				label := ""
				for i, k := range keys {
					v, _ := dp.Attributes.Value(attribute.Key(k))
					if i > 0 {
						label += "/"
					}
					label += v.String()
				}
				out[label] += dp.Value
			}
		}
	}
	return out
}

// gauge collects the gauge of runs by state.
func gauge(t *testing.T, reader *sdkmetric.ManualReader, name string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				v, _ := dp.Attributes.Value("idem.state")
				out[v.String()] += dp.Value
			}
		}
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
