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
}

// Error implements error.
func (e *FailedError) Error() string {
	return fmt.Sprintf("workflow %q (key %q in scope %q) failed: %s", e.Workflow, e.ID, e.Scope, e.Message)
}

// Is makes errors.Is(err, ErrFailed) true.
func (e *FailedError) Is(target error) bool { return target == ErrFailed }

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
// its history holds at that position, or returned without calling steps the history holds.
// This happens when a deploy changed a workflow while runs of it were in progress. The run is
// left as it was (running, with its history intact); it is retried when its lease expires, and
// after Config.MaxAttempts it goes to the reconcile hook. Deploy a compatible version (or a new
// workflow name for the new code) and the run resumes.
//
//	var nd *workflow.NonDeterminismError
//	if errors.As(err, &nd) {
//		log.Printf("run diverged at step %d: stored %s, code called %s", nd.Seq, nd.Stored, nd.Called)
//	}
type NonDeterminismError struct {
	Workflow string
	Seq      int    // the position that differs, from 1
	Stored   string // "kind:name" recorded at Seq, or "" if the history ends before Seq
	Called   string // "kind:name" the code called at Seq, or "" if the code returned
}

// Error implements error.
func (e *NonDeterminismError) Error() string {
	switch {
	case e.Called == "":
		return fmt.Sprintf("workflow %q is not deterministic: its history has step %s at #%d, but the code returned without calling it (did a deploy remove a step?)", e.Workflow, e.Stored, e.Seq)
	default:
		return fmt.Sprintf("workflow %q is not deterministic: step #%d is %s in the run's history, but the code called %s (did a deploy change the steps?)", e.Workflow, e.Seq, e.Stored, e.Called)
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
