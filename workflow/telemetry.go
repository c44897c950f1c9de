package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/telemetry"
)

// The engine's spans:
//
//   - idem.workflow.run: a call of Workflow.Run, from the first lookup to the answer, with the
//     steps it ran as children. Its idem.outcome says how the call ended: done, replay, failed,
//     cancelled, in_flight, mismatch or stopped (the run stopped without an outcome, and will be
//     resumed).
//   - idem.workflow.resume: the River job that continues a run (after a crash, or after
//     StartTx). Its parent is the span that started the run, read from the run's stored trace
//     context, so that the part of a run done in another process, hours later, sits in the trace
//     of the request that started it; the job's own span, when River is traced, is linked.
//   - idem.workflow.step: one step, with its name, kind, position and, when it ran, its
//     attempts; a step answered from the run's history has idem.replayed=true.
//   - idem.workflow.scan: the recovery scan.
//
// Key IDs are never recorded (a client's key may be a secret), in attributes, events, error texts
// or log records: a run's spans carry idem.key.hash, the short hash that stands for its key (see
// internal/redact), and its log records key_hash; Config.RecordKeys puts the IDs themselves in
// instead. Scopes and workflow names are recorded as they are.

var propagator = propagation.TraceContext{}

// traceparent returns the W3C traceparent of the span in ctx, "" when there is none: it is kept
// with the run, so that a resume in another process links back to the request that started it.
func traceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	return carrier["traceparent"]
}

// storedSpan returns the span context kept with a run, if it has a valid one.
func storedSpan(traceContext string) (trace.SpanContext, bool) {
	if traceContext == "" {
		return trace.SpanContext{}, false
	}
	sc := trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceContext}))
	return sc, sc.IsValid()
}

// startResumeSpan starts the span of a resume job. Its parent is the run's stored span context,
// so that the resumed part of the run joins the trace of the request that started it; a span
// already in ctx (River's own, when River is traced) is linked instead of being the parent.
func (e *Engine) startResumeSpan(ctx context.Context, traceContext string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...)}
	if stored, ok := storedSpan(traceContext); ok {
		if current := trace.SpanContextFromContext(ctx); current.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: current}))
		}
		ctx = trace.ContextWithRemoteSpanContext(ctx, stored)
	}
	return e.tel.Tracer.Start(ctx, "idem.workflow.resume", opts...)
}

// endSpan records how an operation on key ended on span and ends it.
func (e *Engine) endSpan(span trace.Span, outcome string, err error, key redact.Key) {
	if span.IsRecording() {
		span.SetAttributes(telemetry.Outcome.String(outcome))
		if err != nil {
			span.SetStatus(codes.Error, e.keys.Text(err.Error(), key))
		}
	}
	span.End()
}

// redactedError is an error as records may carry it (see Engine.recordable).
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// recordable returns err with the key's ID replaced in its text, for an error that goes nowhere
// but into records: the errors of the engine's River jobs, which River logs and stores with the
// job. errors.Is and errors.As still see through it (River's JobSnooze among them).
func (e *Engine) recordable(err error, key redact.Key) error {
	if err == nil {
		return nil
	}
	if msg := e.keys.Text(err.Error(), key); msg != err.Error() {
		return &redactedError{msg: msg, err: err}
	}
	return err
}

// runOutcome names how a call that ran or replayed a run ended, for spans and logs.
func runOutcome(err error, replayed bool) string {
	switch {
	case err == nil && replayed:
		return "replay"
	case err == nil:
		return "done"
	case errors.Is(err, ErrCancelled):
		return "cancelled"
	case errors.Is(err, ErrFailed):
		return "failed"
	case errors.Is(err, ErrDeadlineExceeded):
		return "timed_out"
	case errors.Is(err, idem.ErrInFlight):
		return "in_flight"
	case errors.Is(err, idem.ErrMismatch):
		return "mismatch"
	}
	return "stopped"
}

// stepSpan is one step's telemetry: its span, and its attempts' metrics.
type stepSpan struct {
	e     *Engine
	key   redact.Key // the run's
	span  trace.Span
	attrs metric.MeasurementOption // workflow and kind
	kind  string
	wf    string
}

// startStep starts the span of step seq, and returns the context its attempts run in.
func (e *Engine) startStep(ctx context.Context, key redact.Key, workflowName, kind, name string, seq int, replayed bool) (context.Context, *stepSpan) {
	ctx, span := e.tel.Tracer.Start(ctx, "idem.workflow.step", trace.WithSpanKind(trace.SpanKindInternal))
	if span.IsRecording() {
		span.SetAttributes(telemetry.Workflow.String(workflowName), telemetry.StepName.String(name),
			telemetry.StepKind.String(kind), telemetry.StepSeq.Int(seq), telemetry.Replayed.Bool(replayed))
	}
	return ctx, &stepSpan{e: e, key: key, span: span, kind: kind, wf: workflowName,
		attrs: metric.WithAttributeSet(attribute.NewSet(telemetry.Workflow.String(workflowName), telemetry.StepKind.String(kind)))}
}

// attempt records one attempt of the step: how long it took and how it ended (ok, error, or
// stopped when it stopped the run).
func (s *stepSpan) attempt(ctx context.Context, started time.Time, outcome string) {
	tel := s.e.tel
	tel.StepDuration.Record(ctx, time.Since(started).Seconds(), s.attrs)
	tel.StepExecutions.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		telemetry.Workflow.String(s.wf), telemetry.StepKind.String(s.kind), telemetry.Outcome.String(outcome))))
}

// retry records that the step failed and is tried again.
func (s *stepSpan) retry(ctx context.Context, attempt int, err error) {
	s.e.tel.StepRetries.Add(ctx, 1, s.attrs)
	if s.span.IsRecording() {
		s.span.AddEvent("retry", trace.WithAttributes(telemetry.Attempt.Int(attempt), attribute.String("error", s.e.keys.Text(err.Error(), s.key))))
	}
}

// failed records a failed attempt on the step's span, with its error, as its row in the run's
// failed attempts has it (see Engine.RunGet).
func (s *stepSpan) failed(_ context.Context, attempt int, outcome store.AttemptOutcome, err error) {
	if s.span.IsRecording() {
		s.span.AddEvent("attempt failed", trace.WithAttributes(telemetry.Attempt.Int(attempt), attribute.String("idem.attempt.outcome", string(outcome)),
			attribute.String("error", s.e.keys.Text(clipError(err.Error(), maxAttemptError), s.key))))
	}
}

// end ends the step's span: attempt is the number of its last attempt in this process (0 for a
// step replayed from the history).
func (s *stepSpan) end(attempt int, err error) {
	if s.span.IsRecording() {
		if attempt > 0 {
			s.span.SetAttributes(telemetry.Attempt.Int(attempt))
		}
		if err != nil {
			s.span.SetStatus(codes.Error, s.e.keys.Text(err.Error(), s.key))
		}
	}
	s.span.End()
}

// countResume records a run taken over from an expired lease.
func (e *Engine) countResume(ctx context.Context, workflowName, by string) {
	e.tel.Resumes.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(telemetry.Workflow.String(workflowName), attribute.String("idem.by", by))))
}

// countReconcile records a run handed to the reconcile decision.
func (e *Engine) countReconcile(ctx context.Context, workflowName string, reason ReconcileReason, decision string) {
	e.tel.Reconciles.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(telemetry.Workflow.String(workflowName),
		telemetry.Reason.String(string(reason)), telemetry.Decision.String(decision))))
}

// observeRuns registers the gauge of runs by state (idem.workflow.runs). Done runs are not
// counted: they are the bulk of the table, and counting them would read all of it on every
// collection; the other states are read from their partial index.
func (e *Engine) observeRuns() {
	m := e.tel.Meter()
	gauge, err := m.Int64ObservableGauge("idem.workflow.runs", metric.WithUnit("{run}"),
		metric.WithDescription("Workflow runs by state (done runs are not counted), read from the database at each collection."))
	if err != nil {
		return
	}
	schema := attribute.String("idem.schema", e.cfg.Schema)
	e.bg.gauge, _ = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		counts, err := e.st.RunCountByState(ctx, e.db)
		if err != nil {
			return fmt.Errorf("workflow: error counting runs by state: %w", e.tablesError(err))
		}
		for state, n := range counts {
			o.ObserveInt64(gauge, n, metric.WithAttributes(telemetry.State.String(string(state)), schema))
		}
		return nil
	}, gauge)
}
