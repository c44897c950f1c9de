package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

// StartTx starts the run for key in the background, as part of t: the run and the River job
// that will execute it are inserted in t, so they exist if and only if t commits (the
// transactional outbox, for a whole workflow). Use it to start a workflow from a transaction
// that does other work, and to answer a request before the workflow is done. Call [Workflow.Run]
// with the same key and input later to get the result (or idem.ErrInFlight while it runs).
//
// Starting a key that was already started (and not expired) with the same input does nothing
// and returns nil; with another input, or by another workflow or idem.Do, it returns
// idem.ErrMismatch. It needs the engine's River client (see [Engine.SetClient]).
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
//		if _, err := t.Exec(ctx, `INSERT INTO payouts (id, status) VALUES ($1, 'pending')`, id); err != nil {
//			return err
//		}
//		return Payout.StartTx(ctx, engine, t, idem.Key{Scope: merchantID, ID: id}, req)
//	})
func (w *Workflow[In, Out]) StartTx(ctx context.Context, e *Engine, t pgx.Tx, key idem.Key, in In) error {
	if e == nil || t == nil {
		return errors.New("workflow: StartTx needs an engine and a transaction")
	}
	if err := key.Validate(); err != nil {
		return err
	}
	if d, ok := e.workflows[w.name]; !ok || d != Definition(w) {
		return fmt.Errorf("workflow: %q is not registered with this engine; add it to Config.Workflows so that its runs can be resumed", w.name)
	}
	client, err := e.riverClient(ctx)
	if err != nil {
		return err
	}
	input, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("workflow: error encoding input of type %T as JSON: %w", in, err)
	}
	fingerprint := key.Fingerprint
	if fingerprint == nil {
		fingerprint = idem.Fingerprint("idem.workflow.input", w.name, string(input))
	}

	if err := e.heldByDo(ctx, w.name, key); err != nil {
		return err
	}
	conc, err := w.concurrency(input)
	if err != nil {
		return err
	}
	p := store.RunEnqueueParams{Scope: key.Scope, ID: key.ID, Fingerprint: fingerprint, Workflow: w.name, Input: input, Trace: traceparent(ctx),
		Concurrency: conc}
	ok, err := e.enqueue(ctx, client, t, p, resumeStarted)
	if err != nil {
		return fmt.Errorf("workflow: error starting run: %w", e.tablesError(err))
	}
	if !ok {
		kr, err := e.st.RunLookup(ctx, t, key.Scope, key.ID)
		switch {
		case err != nil:
			return fmt.Errorf("workflow: error looking up key: %w", err)
		case !kr.Found:
			// Another transaction holds the key's lock: a start (or a Do) that has not
			// committed yet.
			return &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: time.Second}
		case !reusable(kr):
			return claimed(kr, w.name, key, fingerprint) // nil: this run, started before
		}
		// An expired, finished key is a new key, as for Run: take it, ownerless.
		r, ok, err := e.st.RunReplace(ctx, t, store.RunReplaceParams{RunStartParams: store.RunStartParams{Scope: key.Scope, ID: key.ID,
			Fingerprint: fingerprint, Workflow: w.name, Input: input, Trace: p.Trace, Concurrency: conc}, Queued: conc != nil})
		switch {
		case err != nil:
			return fmt.Errorf("workflow: error starting run: %w", err)
		case !ok:
			return fmt.Errorf("workflow: key %q in scope %q changed while the run was being started; try again", key.ID, key.Scope)
		case conc != nil:
			return e.admit(ctx, t, w.name, *conc, "", "")
		}
		return e.insertResume(ctx, client, t, key, r.LeaseExpires, resumeStarted)
	}
	return nil
}
