package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
)

// Get returns the outcome of the run under key without running anything: no step, no takeover,
// no lease, whatever state the run is in. It is the read-only twin of [Workflow.Run], for a
// status endpoint or a client that polls.
//
//   - Done: its output.
//   - Failed: the stored failure, a *FailedError (errors.Is(err, ErrFailed)).
//   - Cancelled: a *CancelledError (errors.Is(err, ErrCancelled)).
//   - Timed out: a *TimedOutError (errors.Is(err, ErrDeadlineExceeded)).
//   - Not finished (running, sleeping, awaiting a signal, or waiting to be resumed):
//     idem.ErrInFlight, an *idem.InFlightError whose RetryAfter is when the owner's lease runs
//     out (or, with no live owner, the engine's ScanInterval).
//   - No run under key (never started, expired, or a key of idem.Do's): idem.ErrNotFound.
//   - A run of another workflow: idem.ErrMismatch.
//
// The workflow need not be registered with e: any engine on the same database and schema reads
// it.
//
//	receipt, err := Payout.Get(ctx, engine, idem.Key{Scope: "merchant:7", ID: id})
//	switch {
//	case errors.Is(err, idem.ErrInFlight):
//		// 202 Accepted, with Retry-After
//	case errors.Is(err, idem.ErrNotFound):
//		// 404
//	}
func (w *Workflow[In, Out]) Get(ctx context.Context, e *Engine, key idem.Key) (Out, error) {
	var zero Out
	if e == nil {
		return zero, errors.New("workflow: Get needs an engine; e is nil")
	}
	if err := key.Validate(); err != nil {
		return zero, err
	}
	kr, err := e.st.RunLookup(ctx, e.db, key.Scope, key.ID)
	switch {
	case err != nil:
		return zero, fmt.Errorf("workflow: error looking up key: %w", e.tablesError(err))
	case !kr.Found:
		return zero, runNotFound(key)
	case kr.KeyWorkflow == nil:
		return zero, fmt.Errorf("%w: key %q in scope %q belongs to idem.Do, not to a run of workflow %q", idem.ErrNotFound, key.ID, key.Scope, w.name)
	case kr.State == nil:
		return zero, runNotFound(key)
	case *kr.KeyWorkflow != w.name:
		return zero, fmt.Errorf("%w: key %q in scope %q belongs to a run of workflow %q, not %q", idem.ErrMismatch, key.ID, key.Scope, *kr.KeyWorkflow, w.name)
	}
	state := *kr.State
	if state.Finished() && !kr.RunLive {
		return zero, fmt.Errorf("%w: the run under key %q in scope %q has expired", idem.ErrNotFound, key.ID, key.Scope)
	}
	if state.Finished() {
		data, _, err := storedOutcome(w.name, key, state, kr.Output)
		if err != nil {
			return zero, err
		}
		var out Out
		if err := json.Unmarshal(data, &out); err != nil {
			return zero, fmt.Errorf("workflow: stored output of key %q in scope %q cannot be decoded into %T (did the output type change?): %w", key.ID, key.Scope, out, err)
		}
		return out, nil
	}
	retry := e.cfg.ScanInterval
	if kr.LeaseLive {
		retry = max(time.Second, kr.LeaseLeft)
	}
	return zero, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: retry}
}
