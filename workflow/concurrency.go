package workflow

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

// Per-key concurrency (Workflow.WithConcurrency). Every decision about a key's slots is made
// under the key's lock (store.ConcurrencyLock), in the transaction that changes them:
//
//   - a run that Workflow.Run starts decides in its first transaction whether it may run, and
//     commits before its code runs; one that must wait is queued;
//   - a run started without an owner (StartTx, a child, a fork, a resumed run) is queued, and
//     admitted at once when its key has a free slot;
//   - the transaction that ends an active run (its outcome, a cancel, a timeout, a reconcile
//     decision) starts the oldest queued runs of its key, as many as its free slots, and inserts
//     their resume jobs, so that a queued run is woken, not polled.
//
// Sleeping and awaiting runs keep their slot: they are active, only not in a process.

// admit starts, in t and under the key's lock, the oldest queued runs of a workflow's concurrency
// key that its free slots allow, counting without the run endingScope/endingID that ends in t,
// and inserts their resume jobs.
func (e *Engine) admit(ctx context.Context, t pgx.Tx, workflow string, c store.Concurrency, endingScope, endingID string) error {
	if err := e.st.ConcurrencyLock(ctx, t, workflow, c.Key); err != nil {
		return err
	}
	admitted, err := e.st.RunAdmit(ctx, t, workflow, c.Key, endingScope, endingID)
	if err != nil || len(admitted) == 0 {
		return err
	}
	jobs, err := e.jobs(ctx)
	if err != nil {
		return err
	}
	params := make([]river.InsertManyParams, 0, len(admitted))
	for _, a := range admitted {
		params = append(params, river.InsertManyParams{Args: ResumeArgs{Scope: a.Scope, ID: a.ID, LeaseExpiry: a.Generation, Reason: resumeAdmitted},
			InsertOpts: e.resumeOpts()})
	}
	if err := jobs.insertManyTx(ctx, t, params); err != nil {
		return fmt.Errorf("error inserting the jobs that start queued runs: %w", err)
	}
	return nil
}

// admitEnded is admit for a run that ends in t by other hands than its owner's (a cancel, a
// timeout while it waited, a reconcile decision): it reads the run's key. A run that was queued
// held no slot, and frees none.
func (e *Engine) admitEnded(ctx context.Context, t pgx.Tx, key idem.Key, wasQueued bool) error {
	if wasQueued {
		return nil
	}
	workflow, c, ok, err := e.st.RunConcurrency(ctx, t, key.Scope, key.ID)
	if err != nil || !ok {
		return err
	}
	return e.admit(ctx, t, workflow, c, key.Scope, key.ID)
}

// enqueue creates a run without an owner, in t (StartTx, a child, a fork): running, with the
// resume job that takes it, or, for a limited workflow, queued and admitted at once when its key
// has a free slot. ok is false when the key is taken.
func (e *Engine) enqueue(ctx context.Context, jobs jobInserter, t pgx.Tx, p store.RunEnqueueParams, reason string) (bool, error) {
	p.Queued = p.Concurrency != nil
	generation, ok, err := e.st.RunEnqueue(ctx, t, p)
	if err != nil || !ok {
		return ok, err
	}
	if p.Concurrency != nil {
		return true, e.admit(ctx, t, p.Workflow, *p.Concurrency, "", "")
	}
	return true, e.insertResume(ctx, jobs, t, idem.Key{Scope: p.Scope, ID: p.ID}, generation, reason)
}

// readmit decides, for a run RunResume just made running again (ownerless), whether its
// concurrency key lets it run now: a run that was running kept its slot; one that was failed or
// cancelled must find a free one, or wait in the queue.
func (e *Engine) readmit(ctx context.Context, t pgx.Tx, key idem.Key, was store.RunState) (bool, error) {
	if was == store.RunRunning {
		return true, nil
	}
	workflow, c, ok, err := e.st.RunConcurrency(ctx, t, key.Scope, key.ID)
	if err != nil || !ok {
		return true, err
	}
	if err := e.st.ConcurrencyLock(ctx, t, workflow, c.Key); err != nil {
		return false, err
	}
	admit := e.st.RunAdmitStartStmt(key.Scope, key.ID, workflow, c)
	return store.ScanAdmitted(t.QueryRow(ctx, admit.SQL, admit.Args...))
}
