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

// StartOpts are options for [Workflow.StartTx]. nil means the defaults.
//
//	err := Payout.StartTx(ctx, engine, t, key, req, &workflow.StartOpts{Attributes: map[string]string{"customer": "c-42"}})
type StartOpts struct {
	// Attributes are stored with the run, as RunOpts.Attributes are, when this call starts it.
	Attributes map[string]string
}

// StartTx starts the run for key in the background, as part of t: the run and the River job
// that will execute it are inserted in t, so they exist if and only if t commits (the
// transactional outbox, for a whole workflow). Use it to start a workflow from a transaction
// that does other work, and to answer a request before the workflow is done. Call [Workflow.Run]
// with the same key and input later to get the result (or idem.ErrInFlight while it runs).
//
// Starting a key that was already started (and not expired) with the same input does nothing
// and returns nil; with another input, or by another workflow or idem.Do, it returns
// idem.ErrMismatch. It needs the engine's River client (see [Engine.SetClient]). opts is
// optional: at most one, nil for the defaults.
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
//		if _, err := t.Exec(ctx, `INSERT INTO payouts (id, status) VALUES ($1, 'pending')`, id); err != nil {
//			return err
//		}
//		return Payout.StartTx(ctx, engine, t, idem.Key{Scope: merchantID, ID: id}, req)
//	})
func (w *Workflow[In, Out]) StartTx(ctx context.Context, e *Engine, t pgx.Tx, key idem.Key, in In, opts ...*StartOpts) error {
	if e == nil || t == nil {
		return errors.New("workflow: StartTx needs an engine and a transaction")
	}
	if err := key.Validate(); err != nil {
		return err
	}
	if d, ok := e.workflows[w.name]; !ok || d != Definition(w) {
		return fmt.Errorf("workflow: %q is not registered with this engine; add it to Config.Workflows so that its runs can be resumed", w.name)
	}
	var o StartOpts
	switch {
	case len(opts) > 1:
		return fmt.Errorf("workflow: StartTx takes at most one *StartOpts (got %d)", len(opts))
	case len(opts) == 1 && opts[0] != nil:
		o = *opts[0]
	}
	if err := validateAttributes("StartOpts.Attributes", o.Attributes, false); err != nil {
		return err
	}
	jobs, err := e.jobs(ctx)
	if err != nil {
		return err
	}
	input, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("workflow: error encoding input of type %T as JSON: %w", in, err)
	}
	if err := e.checkInput(w.name, input); err != nil {
		return err
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
	_, err = e.startOwnerless(ctx, jobs, t, store.RunEnqueueParams{Scope: key.Scope, ID: key.ID, Fingerprint: fingerprint, Workflow: w.name,
		Input: input, Trace: traceparent(ctx), Concurrency: conc, Attributes: o.Attributes, Version: e.cfg.Version}, resumeStarted)
	return err
}

// startOwnerless is the ownerless start, StartTx's and a schedule's: the run, with no owner, and
// the River job that runs it (or, for a limited workflow, queued and admitted when its key has a
// free slot), in t. started is false when the key holds this run already (nothing is written); a
// key of another workflow, of idem.Do or of other input is idem.ErrMismatch, one whose start is in
// flight idem.ErrInFlight. An expired, finished key is a new key, as for Run.
func (e *Engine) startOwnerless(ctx context.Context, jobs jobInserter, t pgx.Tx, p store.RunEnqueueParams, reason string) (started bool, err error) {
	key := idem.Key{Scope: p.Scope, ID: p.ID}
	ok, err := e.enqueue(ctx, jobs, t, p, reason)
	if err != nil {
		return false, fmt.Errorf("workflow: error starting run: %w", e.tablesError(err))
	}
	if ok {
		return true, nil
	}
	kr, err := e.st.RunLookup(ctx, t, key.Scope, key.ID)
	switch {
	case err != nil:
		return false, fmt.Errorf("workflow: error looking up key: %w", err)
	case !kr.Found:
		// Another transaction holds the key's lock: a start (or a Do) that has not
		// committed yet.
		return false, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: time.Second}
	case !reusable(kr):
		return false, claimed(kr, p.Workflow, key, p.Fingerprint) // nil: this run, started before
	}
	// An expired, finished key is a new key, as for Run: take it, ownerless.
	r, ok, err := e.st.RunReplace(ctx, t, store.RunReplaceParams{RunStartParams: store.RunStartParams{Scope: key.Scope, ID: key.ID,
		Fingerprint: p.Fingerprint, Workflow: p.Workflow, Input: p.Input, Trace: p.Trace, Timeout: p.Timeout, Concurrency: p.Concurrency,
		Attributes: p.Attributes, Version: p.Version}, Queued: p.Concurrency != nil})
	switch {
	case err != nil:
		return false, fmt.Errorf("workflow: error starting run: %w", err)
	case !ok:
		return false, fmt.Errorf("workflow: key %q in scope %q changed while the run was being started; try again", key.ID, key.Scope)
	case p.Concurrency != nil:
		return true, e.admit(ctx, t, p.Workflow, *p.Concurrency, "", "")
	}
	return true, e.insertResume(ctx, jobs, t, key, r.LeaseExpires, reason)
}
