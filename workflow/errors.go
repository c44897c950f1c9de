package workflow

import (
	"errors"
	"fmt"
)

var (
	// ErrLeaseLost means this process no longer owns the run: its lease ran out (the process was
	// paused, or cut off from Postgres, for longer than Config.Lease) and another worker took the
	// run over, or the run was reconciled. Nothing this process did after losing the lease was
	// committed, and the run goes on elsewhere. Retry later with the same key to get its result.
	//
	//	if errors.Is(err, workflow.ErrLeaseLost) {
	//		w.WriteHeader(http.StatusConflict) // the client retries and gets the result
	//	}
	ErrLeaseLost = errors.New("workflow: lease was lost; another worker owns the run now")

	// ErrNonDeterminism is matched by a *NonDeterminismError: the workflow's code no longer calls
	// the steps its stored history recorded, in the same order. Nothing was written.
	//
	//	if errors.Is(err, workflow.ErrNonDeterminism) {
	//		alert("a deploy changed a workflow with runs in progress: " + err.Error())
	//	}
	ErrNonDeterminism = errors.New("workflow: code does not match the run's history")

	// ErrFailed is matched by a *FailedError: the run ended with an error, which was stored and
	// is returned again on every retry with the same key.
	//
	//	if errors.Is(err, workflow.ErrFailed) { ... } // final: do not retry with this key
	ErrFailed = errors.New("workflow: run failed")

	// ErrCancelled is matched by a *CancelledError: the run was cancelled by an operator
	// (Engine.RunCancel). It stopped at a step boundary, and every retry with its key gets the
	// cancellation back.
	//
	//	if errors.Is(err, workflow.ErrCancelled) { ... } // final: do not retry with this key
	ErrCancelled = errors.New("workflow: run was cancelled")

	// ErrStepFailed is matched by a *StepError: a step used up its attempts.
	//
	//	if errors.Is(err, workflow.ErrStepFailed) { return compensate(ctx) }
	ErrStepFailed = errors.New("workflow: step failed")
)

// FailedError is the stored, final failure of a run, returned by the run that failed and, the
// same, by every later call with its key. It carries the error's message, not the error itself:
// a replay cannot rebuild a Go error value, and the first answer must equal the replays. A
// failure that callers branch on belongs in the workflow's output type instead.
//
//	var failed *workflow.FailedError
//	if errors.As(err, &failed) {
//		log.Printf("payout %s failed: %s", failed.ID, failed.Message)
//	}
type FailedError struct {
	Workflow  string // the workflow's name
	Scope, ID string // the run's key
	Message   string // the error that ended the run, as stored

	// Reason says why the engine, rather than the workflow's code, failed the run:
	// FailureNondeterministic, with Divergence saying where. "" for a failure of the code.
	Reason     FailureReason
	Divergence *Divergence
}

// FailureReason says why the engine failed a run (RunRow.Reason, FailedError.Reason).
//
//	if run.Reason == workflow.FailureNondeterministic { ... }
type FailureReason string

// FailureNondeterministic: the run's code no longer matched its history (see
// [NonDeterminismError]); the run failed at once, without retries.
//
//	if errors.Is(err, workflow.ErrNonDeterminism) { ... } // a *FailedError with this reason matches
const FailureNondeterministic FailureReason = "nondeterministic"

// Error implements error.
func (e *FailedError) Error() string {
	return fmt.Sprintf("workflow %q (key %q in scope %q) failed: %s", e.Workflow, e.ID, e.Scope, e.Message)
}

// Is makes errors.Is(err, ErrFailed) true, and errors.Is(err, ErrNonDeterminism) for a run
// failed because its code diverged from its history.
func (e *FailedError) Is(target error) bool {
	return target == ErrFailed || (target == ErrNonDeterminism && e.Reason == FailureNondeterministic)
}

// CancelledError is the stored outcome of a cancelled run, returned to every call with its key.
//
//	var cancelled *workflow.CancelledError
//	if errors.As(err, &cancelled) {
//		log.Printf("payout %s was cancelled: %s", cancelled.ID, cancelled.Reason)
//	}
type CancelledError struct {
	Workflow  string // the workflow's name
	Scope, ID string // the run's key
	Reason    string // as given to RunCancel
}

// Error implements error.
func (e *CancelledError) Error() string {
	return fmt.Sprintf("workflow %q (key %q in scope %q) was cancelled: %s", e.Workflow, e.ID, e.Scope, e.Reason)
}

// Is makes errors.Is(err, ErrCancelled) true.
func (e *CancelledError) Is(target error) bool { return target == ErrCancelled }

// StepError is returned by a step that used up its attempts, or that failed with an error marked
// as permanent. The failure is stored in the run's history, so a resumed run gets the same
// StepError at the same step instead of running the step again. Like [FailedError], it carries
// the message, for the same reason.
//
//	charge, err := steps.Call(ctx, "charge", chargeCard, nil)
//	var stepErr *workflow.StepError
//	if errors.As(err, &stepErr) {
//		return Receipt{}, fmt.Errorf("charging after %d attempts: %w", stepErr.Attempts, err)
//	}
type StepError struct {
	Step     string // the step's name
	Seq      int    // its position in the run, from 1
	Attempts int    // how many times it ran
	Message  string // the last attempt's error
}

// Error implements error.
func (e *StepError) Error() string {
	return fmt.Sprintf("step %q (#%d) failed after %s: %s", e.Step, e.Seq, plural(e.Attempts, "attempt"), e.Message)
}

// Is makes errors.Is(err, ErrStepFailed) true.
func (e *StepError) Is(target error) bool { return target == ErrStepFailed }

// NonDeterminismError reports that a resumed run's code called a different step than the one
// its history holds at that position, or returned without calling steps the history holds: a
// deploy changed the workflow while runs of it were in progress. Retries cannot help, so the
// run stops at once and is stored as failed, with [FailureNondeterministic] as its reason and
// this divergence (RunRow.Reason, RunRow.Divergence); its history stays as it was. Put the
// change behind [Patched] and resume the run ([Engine.RunResume]), or fork it from the step
// before the divergence ([Engine.RunFork]).
//
//	var nd *workflow.NonDeterminismError
//	if errors.As(err, &nd) {
//		log.Printf("run diverged at step %d: stored %s %q, code called %s %q", nd.Seq, nd.StoredKind, nd.StoredName, nd.CalledKind, nd.CalledName)
//	}
type NonDeterminismError struct {
	Workflow string
	Divergence
}

// Divergence is where a run's code left the run's history.
//
//	if run.Divergence != nil {
//		fmt.Printf("step %d: history has %s %q\n", run.Divergence.Seq, run.Divergence.StoredKind, run.Divergence.StoredName)
//	}
type Divergence struct {
	Seq        int    `json:"seq"`                   // the position that differs, from 1
	StoredKind string `json:"stored_kind"`           // the kind of the step the history holds there ("tx", "call", "patch", ...)
	StoredName string `json:"stored_name"`           // and its name
	CalledKind string `json:"called_kind,omitempty"` // the kind of step the code asked for there; "" when the code returned
	CalledName string `json:"called_name,omitempty"` // and its name
}

// Error implements error.
func (e *NonDeterminismError) Error() string {
	const todo = "put the change behind workflow.Patched and resume the run (Engine.RunResume, idem runs resume), or fork it from an earlier step (Engine.RunFork)"
	switch {
	case e.StoredKind == patchKind && e.CalledKind == "":
		return fmt.Sprintf("workflow %q diverged from the run's history at step #%d: the history has patch %q there, but the code returned (was a patch removed before its runs were gone?); keep workflow.Deprecated(ctx, %q) at that point until no run has the patch", e.Workflow, e.Seq, e.StoredName, e.StoredName)
	case e.StoredKind == patchKind:
		return fmt.Sprintf("workflow %q diverged from the run's history at step #%d: the history has patch %q there, but the code called %s %q (was a patch removed before its runs were gone?); keep workflow.Deprecated(ctx, %q) at that point until no run has the patch", e.Workflow, e.Seq, e.StoredName, e.CalledKind, e.CalledName, e.StoredName)
	case e.CalledKind == "":
		return fmt.Sprintf("workflow %q diverged from the run's history at step #%d: the history has %s %q there, but the code returned without calling it (did a deploy remove a step?); %s", e.Workflow, e.Seq, e.StoredKind, e.StoredName, todo)
	default:
		return fmt.Sprintf("workflow %q diverged from the run's history at step #%d: the history has %s %q there, but the code called %s %q (did a deploy change the steps?); %s", e.Workflow, e.Seq, e.StoredKind, e.StoredName, e.CalledKind, e.CalledName, todo)
	}
}

// Is makes errors.Is(err, ErrNonDeterminism) true.
func (e *NonDeterminismError) Is(target error) bool { return target == ErrNonDeterminism }

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
