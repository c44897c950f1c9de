package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
	"github.com/jackc/pgx/v5"
)

// ReconcileReason says why a run could not simply be resumed.
//
//	if run.Reason == workflow.ReasonUnregistered { ... }
type ReconcileReason string

const (
	// ReasonMaxAttempts: the run was started or taken over Config.MaxAttempts times without
	// finishing (its processes kept dying, or its code keeps panicking; StuckRun.LastError says
	// which, when it is known). A run whose code no longer matches its history is not retried: it
	// fails at once (see NonDeterminismError).
	ReasonMaxAttempts ReconcileReason = "max_attempts"

	// ReasonUnregistered: no process with the run's workflow in Config.Workflows resumed it
	// within Config.UnregisteredGrace (the workflow was removed or renamed by a deploy).
	ReasonUnregistered ReconcileReason = "unregistered"
)

// StuckRun is a run handed to the reconcile hook.
//
//	var req PayoutReq
//	err := json.Unmarshal(run.Input, &req)
type StuckRun struct {
	Workflow      string
	Scope, ID     string
	Input         json.RawMessage // the run's stored input
	Attempts      int
	RecoveryPoint string // name of the last completed step, "" if none
	LastError     string // why the last attempt stopped, when known
	Reason        ReconcileReason
	Created       time.Time // when the run started
}

// StepKey returns the derived key of the run's step at position seq named name, as the step
// saw it (see [StepKey]): the hook can ask an outside service what became of that call.
//
//	status, err := psp.Lookup(ctx, run.StepKey(2, "charge"))
func (r *StuckRun) StepKey(seq int, name string) string {
	return stepKey(r.Scope, r.ID, r.Created.UnixMicro(), seq, name)
}

// ReconcileFunc decides what becomes of a run that cannot be resumed: set it as
// Config.Reconcile. It runs in a River job; when it returns an error, River retries the job. It
// returns one of [ResumeLater], [Complete] or [Fail].
//
//	cfg.Reconcile = func(ctx context.Context, run *workflow.StuckRun) (workflow.Decision, error) {
//		if run.Reason == workflow.ReasonUnregistered {
//			return workflow.ResumeLater(time.Hour), nil // the rollout is not done yet
//		}
//		alert(ctx, run)
//		return workflow.Fail(fmt.Errorf("gave up after %d attempts: %s", run.Attempts, run.LastError)), nil
//	}
type ReconcileFunc func(ctx context.Context, run *StuckRun) (Decision, error)

// Decision is what a [ReconcileFunc] decided. Make one with ResumeLater, Complete or Fail; the
// zero Decision is not a decision, and is refused (the job fails and River retries it).
//
//	var d workflow.Decision = workflow.ResumeLater(time.Hour)
type Decision struct {
	action   decisionAction
	after    time.Duration
	output   any
	errorMsg string
}

type decisionAction int

const (
	actionNone decisionAction = iota // the zero Decision: no decision, refused
	actionFail
	actionComplete
	actionResume
)

// String names the action for telemetry and logs.
func (a decisionAction) String() string {
	switch a {
	case actionFail:
		return "fail"
	case actionComplete:
		return "complete"
	case actionResume:
		return "resume_later"
	}
	return "none"
}

// ResumeLater leaves the run in progress, to be resumed after d, with a fresh budget of
// Config.MaxAttempts attempts.
//
//	return workflow.ResumeLater(30 * time.Minute), nil
func ResumeLater(d time.Duration) Decision {
	return Decision{action: actionResume, after: max(d, 0)}
}

// Complete ends the run as done with output, which every later call with its key gets as the
// workflow's output; it must encode to JSON that decodes into the workflow's Out type.
//
//	return workflow.Complete(Receipt{Status: "settled-by-ops"}), nil
func Complete(output any) Decision { return Decision{action: actionComplete, output: output} }

// Fail ends the run as failed with err's message, which every later call with its key gets as
// a *FailedError.
//
//	return workflow.Fail(errors.New("payout abandoned; refunded by support")), nil
func Fail(err error) Decision {
	msg := "failed by the reconcile hook"
	if err != nil {
		msg = err.Error()
	}
	return Decision{action: actionFail, errorMsg: msg}
}

// reconcile asks the hook (or the default) what to do with a run that cannot be resumed and
// applies the answer. The write is fenced like a takeover: it only lands if the run still has
// the expired lease that was inspected.
func (e *Engine) reconcile(ctx context.Context, scope, id string, row *store.Inspected, reason ReconcileReason) error {
	run := &StuckRun{Workflow: row.Workflow, Scope: scope, ID: id, Input: row.Input, Attempts: row.Attempts,
		RecoveryPoint: row.RecoveryPoint, LastError: row.LastError, Reason: reason, Created: time.UnixMicro(row.Created)}
	var d Decision
	if e.cfg.Reconcile == nil {
		d = Fail(defaultFailure(run, e.cfg))
	} else {
		var err error
		if d, err = e.cfg.Reconcile(ctx, run); err != nil {
			return fmt.Errorf("workflow: error in reconcile hook for key %q in scope %q: %w", id, scope, err)
		}
	}

	var err error
	switch d.action {
	case actionNone:
		return fmt.Errorf("workflow: the reconcile hook for key %q in scope %q returned a zero workflow.Decision; return workflow.ResumeLater, workflow.Complete or workflow.Fail", id, scope)
	case actionResume:
		_, err = e.st.RunReconcileResume(ctx, e.db, scope, id, row.Token, d.after)
	case actionComplete:
		data, merr := json.Marshal(d.output)
		if merr != nil {
			return fmt.Errorf("workflow: error encoding the reconcile hook's output of type %T as JSON: %w", d.output, merr)
		}
		err = e.reconcileEnd(ctx, scope, id, row, store.RunDone, data)
	case actionFail:
		err = e.reconcileEnd(ctx, scope, id, row, store.RunFailed, encodeFailure(d.errorMsg))
	}
	if err != nil {
		return fmt.Errorf("workflow: error storing reconciliation of key %q in scope %q: %w", id, scope, err)
	}
	e.countReconcile(ctx, row.Workflow, reason, d.action.String())
	e.log.InfoContext(ctx, "workflow: run reconciled", "decision", d.action.String(), "workflow", row.Workflow, "scope", scope,
		e.keys.Log(redact.Key{Scope: scope, ID: id}), "reason", string(reason), "attempts", row.Attempts)
	return nil
}

// reconcileEnd stores the hook's outcome, fenced like a takeover, and wakes the run's parent if
// it waits for it (locked first, as every transaction that ends a child locks it).
func (e *Engine) reconcileEnd(ctx context.Context, scope, id string, row *store.Inspected, state store.RunState, output []byte) error {
	return pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error {
		if err := e.wakeParent(ctx, t, scope, id); err != nil {
			return err
		}
		ended, err := e.st.RunReconcileEnd(ctx, t, scope, id, row.Token, state, output, e.cfg.TTL)
		if err != nil || !ended {
			return err
		}
		return e.admitEnded(ctx, t, idem.Key{Scope: scope, ID: id}, false)
	})
}

func defaultFailure(run *StuckRun, cfg Config) error {
	if run.Reason == ReasonUnregistered {
		return fmt.Errorf("workflow %q is not registered in any process that looked at the run within %s, so the run was failed", run.Workflow, cfg.UnregisteredGrace)
	}
	if run.LastError != "" {
		return fmt.Errorf("run was given up after %d attempts; last error: %s", run.Attempts, run.LastError)
	}
	return errors.New("run was given up after " + plural(run.Attempts, "attempt") + " without finishing")
}
