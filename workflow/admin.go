package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
)

// The admin operations each work in one transaction that locks the run's row first. A
// checkpoint holds that row (its fence) from the statement that writes it until COMMIT, so an
// admin operation waits for a step that is committing, and the step that comes after it sees
// what the operation wrote: the fence checks the lease token and state = 'running', and every
// operation here changes one or both.

// lockedTx runs an admin operation: one transaction that locks the run's row first (waiting for
// a step that is committing), then fn. A key with no run is idem.ErrNotFound.
func (e *Engine) lockedTx(ctx context.Context, key idem.Key, fn func(t pgx.Tx, run store.LockedRun) error) error {
	if err := key.Validate(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error {
		run, ok, err := e.st.RunLock(ctx, t, key.Scope, key.ID)
		switch {
		case err != nil:
			return e.tablesError(fmt.Errorf("workflow: error locking run: %w", err))
		case !ok:
			return e.noRun(ctx, t, key)
		}
		return fn(t, run)
	})
}

// RunCancel cancels the run under key: its stored outcome becomes cancelled with reason, and
// every call with its key (Workflow.Run, Workflow.Get) gets a *CancelledError back
// (errors.Is(err, ErrCancelled)).
//
// It is safe against a live owner. The cancel takes the run's lease token away in the same
// write, so the owner's next checkpoint fails its fence, in the step's own transaction: a Tx step's
// writes after the cancel never commit, and the owner stops with ErrCancelled without retrying.
// The owner notices at its next checkpoint or lease renewal (every Config.Lease/3), whichever
// comes first; a Call step that is already running when the cancel lands runs to its end, and
// its outside effect stays, but its checkpoint is not written. A run with no live owner (its
// process died, it waits for a resume job, or it sleeps or awaits a signal) is simply finished
// as cancelled, and a resume or wake-up job that comes later finds nothing to do.
//
// Cancelling a cancelled run does nothing and returns nil. A done, failed or timed-out run
// cannot be cancelled (the error says so); no run under key is idem.ErrNotFound. The workflow need not be
// registered with e.
//
//	err := engine.RunCancel(ctx, idem.Key{Scope: "merchant:7", ID: "payout-1"}, "customer asked to stop")
func (e *Engine) RunCancel(ctx context.Context, key idem.Key, reason string) error {
	if reason == "" {
		reason = "cancelled by an operator"
	}
	return e.lockedTx(ctx, key, func(t pgx.Tx, run store.LockedRun) error {
		switch {
		case run.State == store.RunCancelled:
			return nil
		case run.State.Finished():
			return fmt.Errorf("workflow: the run of %q under key %q in scope %q is %s and cannot be cancelled; only an unfinished run can", run.Workflow, key.ID, key.Scope, run.State)
		}
		if err := e.st.RunCancel(ctx, t, key.Scope, key.ID, encodeFailure(reason), e.cfg.TTL); err != nil {
			return fmt.Errorf("workflow: error cancelling run: %w", err)
		}
		children, err := e.endRun(ctx, t, key, store.RunCancelled, true, run.State == store.RunQueued)
		if err != nil {
			return fmt.Errorf("workflow: error cancelling run: %w", err)
		}
		e.log.InfoContext(ctx, "workflow: run cancelled", "workflow", run.Workflow, "scope", key.Scope, e.keys.Log(rkey(key)), "owner", run.Owner,
			"reason", e.keys.Text(reason, rkey(key)), "children_cancelled", len(children))
		return nil
	})
}

// RunResume continues a failed, cancelled or stuck run now, from its last completed step, with
// a fresh budget of Config.MaxAttempts attempts: it makes the run running again with no owner,
// and inserts the River resume job that takes it, in the same transaction. So the run is
// continued by whichever process of the application works that job (the engine's River client,
// from [Engine.SetClient], inserts it; the workflow need not be registered with e).
//
//   - Failed (a step failed for good, the workflow returned an error, or the reconcile hook gave
//     the run up after too many attempts): the run's history is cut at its first failed step,
//     so that step runs again, and so do the steps after it; steps before it are replayed from
//     the history. The assumption is that the operator fixed what made it fail. Signals that
//     the cut steps consumed are pending again, and a wait they began is forgotten; events
//     they set stay until the rerun sets them again. A run that failed without a failed step
//     runs its workflow function again over the whole history. A Call step that runs again
//     gets the same derived key (see [StepKey]): an outside service that stored its failed
//     answer under that key gives the same answer again; fork the run ([Engine.RunFork]), whose
//     steps get new keys, to reach such a service afresh.
//   - Cancelled: the run continues where it stopped, its history intact. A run cancelled under
//     a live owner is refused until that owner's lease has run out, so that the resume does not
//     run beside a step the cancelled owner is still finishing.
//   - Running with no live owner (its lease expired, for instance at Config.MaxAttempts,
//     waiting for the reconcile hook): it is handed to a resume job now.
//   - Running with a live owner, done, timed out, sleeping or awaiting a signal (a waiting run
//     is woken by its own job): refused, with an error that says why.
//   - No run under key: idem.ErrNotFound.
//
// A cancelled run that was waiting continues where it waited: a sleep keeps its wake-up time
// and an await its timeout, as after a crash.
//
// A caller waiting on the run with Workflow.Run or Workflow.Get sees it in flight again, and
// then its new outcome.
//
//	err := engine.RunResume(ctx, idem.Key{Scope: "merchant:7", ID: "payout-1"})
func (e *Engine) RunResume(ctx context.Context, key idem.Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	jobs, err := e.jobs(ctx)
	if err != nil {
		return err
	}
	return e.lockedTx(ctx, key, func(t pgx.Tx, run store.LockedRun) error {
		switch {
		case run.State == store.RunDone:
			return fmt.Errorf("workflow: the run of %q under key %q in scope %q is done; there is nothing to resume (fork it under a new key to run it again)", run.Workflow, key.ID, key.Scope)
		case run.LeaseLive && run.State == store.RunCancelled:
			return fmt.Errorf("workflow: the run of %q under key %q in scope %q was cancelled while %s ran it, and that process may still be finishing its current step until its lease runs out (at most Config.Lease); resume it after that", run.Workflow, key.ID, key.Scope, run.Owner)
		case run.LeaseLive:
			return fmt.Errorf("workflow: the run of %q under key %q in scope %q is running in %s, which holds its lease; cancel it first, or let it finish", run.Workflow, key.ID, key.Scope, run.Owner)
		case run.State == store.RunQueued:
			return fmt.Errorf("workflow: the run of %q under key %q in scope %q is queued for a slot of its concurrency key; it starts when one frees", run.Workflow, key.ID, key.Scope)
		case run.State != store.RunFailed && run.State != store.RunCancelled && run.State != store.RunRunning:
			return fmt.Errorf("workflow: the run of %q under key %q in scope %q is %s; only a failed, cancelled or stuck running run can be resumed", run.Workflow, key.ID, key.Scope, run.State)
		case run.State == store.RunFailed:
			if _, err := e.st.RunCutFailed(ctx, t, key.Scope, key.ID); err != nil {
				return fmt.Errorf("workflow: error removing the failed step: %w", err)
			}
		}
		generation, err := e.st.RunReopen(ctx, t, key.Scope, key.ID)
		if err != nil {
			return fmt.Errorf("workflow: error reopening run: %w", err)
		}
		admitted, err := e.readmit(ctx, t, key, run.State)
		if err != nil {
			return fmt.Errorf("workflow: error reopening run: %w", err)
		}
		if !admitted {
			e.log.InfoContext(ctx, "workflow: run resumed by an operator waits for a slot of its concurrency key", "workflow", run.Workflow,
				"scope", key.Scope, e.keys.Log(rkey(key)))
			return nil
		}
		if err := e.insertResume(ctx, jobs, t, key, generation, resumeByOperator); err != nil {
			return err
		}
		e.log.InfoContext(ctx, "workflow: run resumed by an operator", "workflow", run.Workflow, "scope", key.Scope, e.keys.Log(rkey(key)), "from", string(run.State))
		return nil
	})
}

// RunFork starts a new run under newKey, of the same workflow with the same input, whose
// history is the run under key's steps before position fromStep (1 copies nothing, 2 copies
// step 1, and so on): those steps are replayed, not run, the events they set (steps.SetEvent)
// are the new run's events, and the new run runs from fromStep on, through a River resume job
// inserted in the same transaction. It is how an operator reruns a run from a step once the bug
// that broke that step is fixed, without touching the original.
//
// The new run is a run of its own: its steps get new derived keys (see [StepKey]), a run with a
// deadline (RunOpts.Timeout) gets the same timeout counted from the fork, the run's attributes
// are copied (the steps that run again may set theirs again), it keeps the original's code
// version (RunRow.Version: it replays the original's history, so engines with
// Config.ResumeVersions treat it as they treat the original), and calling
// Workflow.Run or Workflow.Get with newKey and the same input joins it. newKey must be unused:
// a key that exists (of a run or of idem.Do) is refused with idem.ErrMismatch. fromStep must be
// between 1 and one more than the run's number of steps. The original run is read as it is,
// whatever its state, and left alone. The new run records where it came from
// (RunRow.ForkedFrom: the original's key and fromStep - 1, the steps copied), which idem runs
// show and idemui display.
//
//	err := engine.RunFork(ctx,
//		idem.Key{Scope: "merchant:7", ID: "payout-1"},
//		idem.Key{Scope: "merchant:7", ID: "payout-1-retry"}, 3)
func (e *Engine) RunFork(ctx context.Context, key, newKey idem.Key, fromStep int) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if err := newKey.Validate(); err != nil {
		return err
	}
	if fromStep < 1 {
		return fmt.Errorf("workflow: fromStep cannot be less than 1 (got %d)", fromStep)
	}
	jobs, err := e.jobs(ctx)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error {
		src, ok, err := e.st.RunForkSource(ctx, t, key.Scope, key.ID)
		switch {
		case err != nil:
			return e.tablesError(fmt.Errorf("workflow: error reading the run to fork: %w", err))
		case !ok:
			return e.noRun(ctx, t, key)
		}
		// Counted once the run is locked, in a statement of its own: a checkpoint that was
		// committing while the lock was awaited is not in the locking statement's snapshot.
		// A large output that is not in its partition would be copied as an empty one.
		steps, missing, err := e.st.RunForkCounts(ctx, t, key.Scope, key.ID, fromStep)
		switch {
		case err != nil:
			return fmt.Errorf("workflow: error reading the run to fork: %w", err)
		case fromStep > steps+1:
			return fmt.Errorf("workflow: fromStep cannot be more than %d, one past the run's %s (got %d)", steps+1, plural(steps, "step"), fromStep)
		case missing > 0:
			return fmt.Errorf("workflow: cannot fork run %q in scope %q: %w: the outputs of %s before step %d (was a partition of idem_run_payloads dropped by hand?)",
				key.ID, key.Scope, store.ErrPayloadMissing, plural(missing, "step"), fromStep)
		}
		// The resume job (or the admission of a queued run) starts the fork once this
		// transaction, which copies its history too, commits.
		ok, err = e.enqueue(ctx, jobs, t, store.RunEnqueueParams{Scope: newKey.Scope, ID: newKey.ID, Fingerprint: src.Fingerprint,
			Workflow: src.Workflow, Input: src.Input, Trace: src.Trace, Timeout: src.Timeout, Concurrency: src.Concurrency,
			Attributes: src.Attributes,
			Version:    src.Version}, resumeForked)
		switch {
		case err != nil:
			return fmt.Errorf("workflow: error creating the forked run: %w", err)
		case !ok:
			return fmt.Errorf("%w: key %q in scope %q is taken; fork into a key that was never used", idem.ErrMismatch, newKey.ID, newKey.Scope)
		}
		if err := e.st.RunForkSteps(ctx, t, key.Scope, key.ID, newKey.Scope, newKey.ID, fromStep); err != nil {
			return fmt.Errorf("workflow: error copying the run's history: %w", err)
		}
		// The copied event steps are replayed, not run: what they published comes with them.
		if err := e.st.RunForkEvents(ctx, t, key.Scope, key.ID, newKey.Scope, newKey.ID, fromStep); err != nil {
			return fmt.Errorf("workflow: error copying the run's events: %w", err)
		}
		newAttr := e.keys.Log(rkey(newKey))
		newAttr.Key = "new_" + newAttr.Key
		e.log.InfoContext(ctx, "workflow: run forked", "workflow", src.Workflow, "scope", key.Scope, e.keys.Log(rkey(key)),
			"new_scope", newKey.Scope, newAttr, "from_step", fromStep)
		return nil
	})
}

// rkey is key as records concern it.
func rkey(key idem.Key) redact.Key { return redact.Key{Scope: key.Scope, ID: key.ID} }

// cancelledOutcome turns an error that stopped a run into the run's cancellation, when that is
// what happened: a cancel takes the lease away, so the owner first sees a lost lease, and only
// the stored state tells the two apart. A lost lease to another owner stays ErrLeaseLost.
func (e *Engine) cancelledOutcome(ctx context.Context, rs *runState, err error) error {
	if !errors.Is(err, ErrLeaseLost) {
		return err
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	kr, lerr := e.st.RunLookup(lctx, e.db, rs.scope, rs.id)
	if lerr != nil || !kr.Found || kr.State == nil || *kr.State != store.RunCancelled {
		return err
	}
	if herr := e.st.RunCancelHeard(lctx, e.db, rs.scope, rs.id, e.owner); herr != nil {
		// The lease then runs out by itself; a resume waits for that.
		e.log.WarnContext(ctx, "workflow: error giving up the lease of a cancelled run", "scope", rs.scope, e.keys.Log(rs.rkey()), e.keys.Error(herr, rs.rkey()))
	}
	e.log.InfoContext(ctx, "workflow: run was cancelled and stopped at its step boundary", "workflow", rs.def.Name(),
		"scope", rs.scope, e.keys.Log(rs.rkey()), "attempt", rs.attempt)
	return cancelledFromStored(rs.def.Name(), idemKey(rs), kr.Output)
}
