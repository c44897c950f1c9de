// Package telemetry holds idem's OpenTelemetry instruments: one tracer and one set of metrics
// per pair of providers, made on first use and kept, so that an operation costs a map lookup and
// the no-op instruments when no SDK is installed. Providers default to the global ones.
//
// Names follow OpenTelemetry's conventions: spans and metrics under "idem.", attributes under
// "idem." too. Key IDs are never recorded (a client's key may be a secret it reuses): package
// internal/redact says what stands for them; scopes are recorded.
package telemetry

import (
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of idem's tracer and meter.
const ScopeName = "github.com/idemkit/idem"

// Attribute keys.
const (
	Scope     = attribute.Key("idem.scope")
	Outcome   = attribute.Key("idem.outcome")
	Workflow  = attribute.Key("idem.workflow")
	StepName  = attribute.Key("idem.step.name")
	StepKind  = attribute.Key("idem.step.kind")
	StepSeq   = attribute.Key("idem.step.seq")
	Attempt   = attribute.Key("idem.attempt")
	Replayed  = attribute.Key("idem.replayed")
	State     = attribute.Key("idem.state")
	Reason    = attribute.Key("idem.reason")
	Decision  = attribute.Key("idem.decision")
	What      = attribute.Key("idem.what")
	HTTPCode  = attribute.Key("http.response.status_code")
	Attempts  = attribute.Key("idem.attempts")
	Resumed   = attribute.Key("idem.resumed")
	Lease     = attribute.Key("idem.lease_owner")
	Signal    = attribute.Key("idem.signal")
	WakeAfter = attribute.Key("idem.wake_after_s")
)

// Set is the tracer and the instruments for one pair of providers.
type Set struct {
	Tracer trace.Tracer

	DoOutcomes     metric.Int64Counter
	DoDuration     metric.Float64Histogram
	StepExecutions metric.Int64Counter
	StepRetries    metric.Int64Counter
	StepDuration   metric.Float64Histogram
	Resumes        metric.Int64Counter
	Reconciles     metric.Int64Counter
	Diverged       metric.Int64Counter
	Reaped         metric.Int64Counter

	meter metric.Meter
}

// Meter returns the set's meter, for instruments with callbacks of their own.
func (s *Set) Meter() metric.Meter { return s.meter }

type providers struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
}

var sets sync.Map // providers -> *Set

// For returns the set for tp and mp; nil means the global provider.
func For(tp trace.TracerProvider, mp metric.MeterProvider) *Set {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	key := providers{tp, mp}
	if s, ok := sets.Load(key); ok {
		return s.(*Set)
	}
	s := newSet(tp, mp)
	actual, _ := sets.LoadOrStore(key, s)
	return actual.(*Set)
}

// seconds are the histogram buckets of durations: from a millisecond to a minute.
var seconds = metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

func newSet(tp trace.TracerProvider, mp metric.MeterProvider) *Set {
	m := mp.Meter(ScopeName)
	s := &Set{Tracer: tp.Tracer(ScopeName), meter: m}
	// The API's instruments never fail to be made; an SDK that refuses one returns a working
	// no-op with the error, and a metric missing is better than an operation failing.
	s.DoOutcomes, _ = m.Int64Counter("idem.do.outcomes", metric.WithUnit("{call}"),
		metric.WithDescription("Calls of idem.Do by outcome: run, replay, in_flight, mismatch, race, invalid, error."))
	s.DoDuration, _ = m.Float64Histogram("idem.do.duration", metric.WithUnit("s"), seconds,
		metric.WithDescription("Time idem.Do took, its function included, by outcome."))
	s.StepExecutions, _ = m.Int64Counter("idem.step.executions", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts of workflow steps, by workflow, kind and outcome (ok, error, stopped)."))
	s.StepRetries, _ = m.Int64Counter("idem.step.retries", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts of workflow steps that failed and were tried again."))
	s.StepDuration, _ = m.Float64Histogram("idem.step.duration", metric.WithUnit("s"), seconds,
		metric.WithDescription("Time one attempt of a workflow step took, by workflow and kind."))
	s.Resumes, _ = m.Int64Counter("idem.workflow.resumes", metric.WithUnit("{run}"),
		metric.WithDescription("Runs taken over from an expired lease (or woken), by workflow."))
	s.Reconciles, _ = m.Int64Counter("idem.workflow.reconciliations", metric.WithUnit("{run}"),
		metric.WithDescription("Runs handed to the reconcile decision, by reason and decision."))
	s.Diverged, _ = m.Int64Counter("idem.workflow.nondeterministic", metric.WithUnit("{run}"),
		metric.WithDescription("Runs failed because their code no longer matched their history, by workflow."))
	s.Reaped, _ = m.Int64Counter("idem.reaped", metric.WithUnit("{key}"),
		metric.WithDescription("Expired keys deleted by idem.Reap, by what they were (do, run)."))
	return s
}
