package workflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemkit/idem"
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

	var generation int64
	err = t.QueryRow(ctx, e.st.enqueue, key.Scope, key.ID, fingerprint, w.name, input, e.cfg.TTL.Microseconds()).Scan(&generation)
	if errors.Is(err, pgx.ErrNoRows) {
		var reuse bool
		if reuse, err = e.checkStarted(ctx, t, w.name, key, fingerprint); err != nil || !reuse {
			return err
		}
		// An expired, finished key is a new key, as for Run: take it, ownerless.
		err = t.QueryRow(ctx, e.st.replace, key.Scope, key.ID, fingerprint, w.name, input, nil, int64(0), e.cfg.TTL.Microseconds()).Scan(&generation)
	}
	if err != nil {
		return fmt.Errorf("workflow: error starting run: %w", err)
	}
	_, err = client.InsertTx(ctx, t, ResumeArgs{Scope: key.Scope, ID: key.ID, LeaseExpiry: generation},
		&river.InsertOpts{Queue: e.cfg.Queue, UniqueOpts: river.UniqueOpts{ByArgs: true}})
	if err != nil {
		return fmt.Errorf("workflow: error inserting the job that runs the workflow: %w", err)
	}
	return nil
}

// checkStarted answers StartTx for a key that exists: nothing to do if it is this workflow with
// this input, a mismatch if not, and reuse if it is finished and expired.
func (e *Engine) checkStarted(ctx context.Context, t pgx.Tx, name string, key idem.Key, fingerprint []byte) (reuse bool, err error) {
	var (
		workflow *string
		stored   []byte
		state    string
		live     bool
	)
	err = t.QueryRow(ctx, `SELECT workflow, fingerprint, state, expires_at > now() FROM `+e.keysTable()+` WHERE scope = $1 AND id = $2`,
		key.Scope, key.ID).Scan(&workflow, &stored, &state, &live)
	if err != nil {
		return false, fmt.Errorf("workflow: error looking up key: %w", err)
	}
	switch {
	case !live && state != "running":
		return true, nil
	case workflow == nil || *workflow != name:
		return false, fmt.Errorf("%w: key %q in scope %q is used by something other than workflow %q; use a new key", idem.ErrMismatch, key.ID, key.Scope, name)
	case stored != nil && !bytes.Equal(stored, fingerprint):
		return false, fmt.Errorf("%w: key %q in scope %q was first used with another input; use a new key for a new request", idem.ErrMismatch, key.ID, key.Scope)
	}
	return false, nil
}

func (e *Engine) keysTable() string {
	if e.cfg.Schema == "" {
		return "idem_keys"
	}
	return pgx.Identifier{e.cfg.Schema, "idem_keys"}.Sanitize()
}
