package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/telemetry"
)

// Definition is a workflow as the [Engine] sees it, whatever its input and output types: what
// [Define] returns. List definitions in Config.Workflows.
//
//	cfg := &workflow.Config{Workflows: []workflow.Definition{Payout, Refund}}
type Definition interface {
	// Name is the workflow's stable name, stored with each run.
	Name() string

	// call decodes input, runs the workflow function and encodes its output.
	call(ctx context.Context, input []byte) ([]byte, error)

	// concurrency is the concurrency key and limit of a run with this input (see
	// Workflow.WithConcurrency); nil when the workflow has none, or the key is "".
	concurrency(input []byte) (*store.Concurrency, error)
}

// Workflow is a workflow with input In and output Out, made by [Define]. Both types must
// round-trip through encoding/json: the input is stored so that any process can resume the run,
// and the output is stored so that every retry gets the same answer.
//
//	var Payout *workflow.Workflow[PayoutReq, Receipt] = workflow.Define("payout", payout)
type Workflow[In, Out any] struct {
	name string
	fn   func(ctx context.Context, in In) (Out, error)

	limit int                // of active runs per concurrency key; 0 for no limit
	key   func(in In) string // a run's concurrency key
}

// MaxConcurrencyKey is the longest concurrency key, in bytes (see [Workflow.WithConcurrency]).
//
//	if len(account) > workflow.MaxConcurrencyKey { ... }
const MaxConcurrencyKey = 200

// WithConcurrency limits how many runs of w with the same concurrency key are active (running,
// sleeping or awaiting) at once: at most limit. key computes a run's concurrency key from its
// input (an account, a customer); a run whose key is "" is not limited. A run that starts when
// its key has no free slot waits, durably and holding nothing, in state queued; the transaction
// that ends an active run of the key (its outcome, a cancel, a timeout) starts the oldest queued
// one, through a River resume job: woken, not polled. Workflow.Run of a queued run answers
// idem.ErrInFlight (or, with RunOpts.Wait, waits for its outcome). Like Define, it is meant for
// package-level variables, and panics on a limit below 1 or a nil key function. It returns w.
//
//	var Payout = workflow.Define("payout", payout).WithConcurrency(1, func(req PayoutReq) string {
//		return req.Account // one payout at a time per account
//	})
//
// Deciding whether a run may start takes the key's lock and one more round trip, and a run of a
// limited workflow commits its start before its code runs (see the README).
func (w *Workflow[In, Out]) WithConcurrency(limit int, key func(in In) string) *Workflow[In, Out] {
	if limit < 1 {
		panic(fmt.Sprintf("workflow: WithConcurrency needs a limit of at least 1 (got %d)", limit))
	}
	if key == nil {
		panic("workflow: WithConcurrency needs a key function; key is nil")
	}
	w.limit, w.key = limit, key
	return w
}

func (w *Workflow[In, Out]) concurrency(input []byte) (*store.Concurrency, error) {
	if w.limit == 0 {
		return nil, nil
	}
	var in In
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, fmt.Errorf("workflow: input of workflow %q cannot be decoded into %T for its concurrency key: %w", w.name, in, err)
	}
	k := w.key(in)
	switch {
	case k == "":
		return nil, nil
	case len(k) > MaxConcurrencyKey:
		return nil, fmt.Errorf("workflow: the concurrency key of a run of %q is %d bytes; it cannot be longer than %d (see WithConcurrency)", w.name, len(k), MaxConcurrencyKey)
	}
	return &store.Concurrency{Key: k, Limit: w.limit}, nil
}

// Define makes a workflow from an ordinary Go function that calls named steps (package steps).
// The step names are the run's recovery points: a resumed run skips the steps it completed and
// gets their stored outputs back. name is stored with every run, so keep it stable across
// deploys; give a new name to code that calls different steps. Define is meant for package
// level variables and panics on an empty name or a nil function, like river.AddWorker.
//
//	var Payout = workflow.Define("payout", func(ctx context.Context, req PayoutReq) (Receipt, error) {
//		hold, err := steps.Tx(ctx, "reserve", func(ctx context.Context, tx pgx.Tx) (Hold, error) {
//			return reserve(ctx, tx, req)
//		}, nil)
//		if err != nil {
//			return Receipt{}, err
//		}
//		charge, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (Charge, error) {
//			return psp.Charge(ctx, key, hold.Amount) // key is the same on every attempt
//		}, nil)
//		if err != nil {
//			return Receipt{}, err
//		}
//		return steps.Tx(ctx, "settle", func(ctx context.Context, tx pgx.Tx) (Receipt, error) {
//			return settle(ctx, tx, hold, charge)
//		}, nil)
//	})
//
// The function must be deterministic in the steps it calls: given the same input and the same
// step outputs, it calls the same steps in the same order. Anything that varies (time, random
// numbers, reads of changing data) belongs inside a step, so that it is recorded. Steps must be
// called one at a time, not from several goroutines at once.
func Define[In, Out any](name string, fn func(ctx context.Context, in In) (Out, error)) *Workflow[In, Out] {
	if name == "" || len(name) > 255 {
		panic("workflow: Define needs a name of 1 to 255 bytes")
	}
	if fn == nil {
		panic("workflow: Define needs a function; fn is nil")
	}
	return &Workflow[In, Out]{name: name, fn: fn}
}

// Name returns the workflow's name.
//
//	fmt.Println(Payout.Name()) // payout
func (w *Workflow[In, Out]) Name() string { return w.name }

func (w *Workflow[In, Out]) call(ctx context.Context, input []byte) ([]byte, error) {
	var in In
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, &machineryError{fmt.Errorf("stored input of workflow %q cannot be decoded into %T (did the input type change?): %w", w.name, in, err)}
	}
	out, err := w.fn(ctx, in)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("error encoding output of type %T as JSON: %w", out, err)
	}
	return data, nil
}

// RunOpts are options for [Workflow.Run]. nil means the defaults.
//
//	receipt, err := Payout.Run(ctx, engine, key, req, &workflow.RunOpts{Wait: 5 * time.Second})
type RunOpts struct {
	// Wait makes a call that finds the run in progress elsewhere wait up to this long for it to
	// finish, and then return its result, instead of returning idem.ErrInFlight at once. If the
	// other owner dies meanwhile, this call takes the run over. Default 0: do not wait.
	Wait time.Duration

	// Replayed, when set, is set to whether the outcome Run returns (an output, or a stored
	// failure) was stored before this call rather than produced by it: what an HTTP handler
	// needs for an Idempotent-Replayed header. A call that took the run over and finished it
	// produced its outcome.
	//
	//	var replayed bool
	//	receipt, err := Payout.Run(ctx, engine, key, req, &workflow.RunOpts{Replayed: &replayed})
	Replayed *bool

	// Timeout gives a run that this call starts a deadline: Timeout after its start, by
	// Postgres's clock, stored with the run so that it holds across resumes, sleeps and awaits.
	// When it passes, the run stops at its next step boundary (a sleeping or awaiting run is
	// woken for it) and is stored as timed out: this and every later call with its key gets a
	// *TimedOutError (errors.Is(err, workflow.ErrDeadlineExceeded)). A step in progress is not
	// interrupted. It applies only when this call starts the run. Default 0: no deadline.
	//
	//	_, err := Payout.Run(ctx, engine, key, req, &workflow.RunOpts{Timeout: 24 * time.Hour})
	Timeout time.Duration

	// Attributes are stored with a run that this call starts, for finding it later
	// (RunListParams.Attributes, `idem runs list --attr k=v`); its steps may change them
	// (SetAttributesTx). At most MaxAttributes, keys of 1 to MaxAttributeKeyLen bytes, values of 1
	// to MaxAttributeValueLen, UTF-8 without control characters. They are not part of the
	// input's fingerprint, and apply only when this call starts the run.
	//
	//	_, err := Payout.Run(ctx, engine, key, req, &workflow.RunOpts{Attributes: map[string]string{"customer": req.Customer}})
	Attributes map[string]string
}

// Run starts the run for key with input in, or continues it, and returns its output.
//
//   - First call: the run starts in this process and runs to its end.
//   - Finished before (and not expired): nothing runs; the stored output, or the stored failure
//     as a *FailedError, is returned.
//   - In progress in another process (its lease is live): idem.ErrInFlight, an
//     *idem.InFlightError whose RetryAfter is when that lease runs out. With RunOpts.Wait, Run
//     waits and then returns the result.
//   - In progress, but its owner died (the lease expired): this call takes the run over and
//     continues it from its last completed step.
//   - Waiting (steps.Sleep, steps.Await), now or after this call got it there: idem.ErrInFlight.
//     A River job continues the run when its wait ends; with RunOpts.Wait, Run waits for the
//     outcome.
//   - Timed out (RunOpts.Timeout): a *TimedOutError, as every retry gets.
//   - Same key with a different input, or a different workflow, or a key of idem.Do:
//     idem.ErrMismatch. The input's fingerprint is key.Fingerprint if set, else a digest of the
//     workflow's name and the input's JSON.
//   - Malformed key: idem.ErrInvalidKey, before any SQL.
//
// When the workflow function returns an error, the run fails for good: the error's message is
// stored and Run returns a *FailedError (as every retry will). When Run itself is stopped (ctx
// is cancelled, the lease is lost, the database is unreachable), nothing final is stored: the
// run stays in progress, and the recovery scan resumes it after its lease expires, in whichever
// process gets the resume job.
//
//	receipt, err := Payout.Run(ctx, engine, idem.Key{Scope: "merchant:7", ID: requestKey}, req, nil)
//	switch {
//	case errors.Is(err, idem.ErrInFlight):
//		// 409 with Retry-After
//	case errors.Is(err, workflow.ErrFailed):
//		// the payout failed for good; err says why
//	}
func (w *Workflow[In, Out]) Run(ctx context.Context, e *Engine, key idem.Key, in In, opts *RunOpts) (Out, error) {
	var zero Out
	if e == nil {
		return zero, errors.New("workflow: Run needs an engine; e is nil")
	}
	if err := key.Validate(); err != nil {
		return zero, err
	}
	if d, ok := e.workflows[w.name]; !ok || d != Definition(w) {
		return zero, fmt.Errorf("workflow: %q is not registered with this engine; add it to Config.Workflows so that its runs can be resumed", w.name)
	}
	if opts == nil {
		opts = &RunOpts{}
	}
	if opts.Wait < 0 {
		return zero, fmt.Errorf("workflow: RunOpts.Wait cannot be negative (got %s)", opts.Wait)
	}
	if opts.Timeout < 0 {
		return zero, fmt.Errorf("workflow: RunOpts.Timeout cannot be negative (got %s)", opts.Timeout)
	}
	if err := validateAttributes("RunOpts.Attributes", opts.Attributes, false); err != nil {
		return zero, err
	}
	if err := e.heldByDo(ctx, w.name, key); err != nil {
		return zero, err
	}
	input, err := json.Marshal(in)
	if err != nil {
		return zero, fmt.Errorf("workflow: error encoding input of type %T as JSON: %w", in, err)
	}
	if err := e.checkInput(w.name, input); err != nil {
		return zero, err
	}
	fingerprint := key.Fingerprint
	if fingerprint == nil {
		fingerprint = idem.Fingerprint("idem.workflow.input", w.name, string(input))
	}
	rk := redact.Key{Scope: key.Scope, ID: key.ID}
	ctx, span := e.tel.Tracer.Start(ctx, "idem.workflow.run", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(telemetry.Workflow.String(w.name), telemetry.Scope.String(key.Scope), e.keys.Attr(rk)))
	result, replayed, err := e.runOrJoin(ctx, w, key, fingerprint, input, opts.Wait, opts.Timeout, opts.Attributes)
	if span.IsRecording() {
		span.SetAttributes(telemetry.Replayed.Bool(replayed))
	}
	e.endSpan(span, runOutcome(err, replayed), err, rk)
	if opts.Replayed != nil {
		*opts.Replayed = replayed
	}
	if err != nil {
		return zero, err
	}
	var out Out
	if err := json.Unmarshal(result, &out); err != nil {
		return zero, fmt.Errorf("workflow: stored output of key %q in scope %q cannot be decoded into %T (did the output type change?): %w", key.ID, key.Scope, out, err)
	}
	return out, nil
}
