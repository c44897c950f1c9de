package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

var (
	// ErrRunNotFound means no run has the key: it was never started, its first step has not
	// committed yet, it expired and was reaped, or the key belongs to idem.Do.
	//
	//	if errors.Is(err, workflow.ErrRunNotFound) { ... } // 404
	ErrRunNotFound = errors.New("workflow: no run has this key")

	// ErrRunFinished means the run has finished (done, failed, cancelled or timed out), so a
	// signal to it would never be read. Nothing was recorded.
	//
	//	if errors.Is(err, workflow.ErrRunFinished) { ... } // 409: too late
	ErrRunFinished = errors.New("workflow: run has finished")
)

// SignalOpts are options for [Engine.SignalTx]. nil means the defaults.
//
//	_, err := engine.SignalTx(ctx, tx, key, "charge.confirmed", event, &workflow.SignalOpts{DedupeID: event.ID})
type SignalOpts struct {
	// DedupeID makes signals with the same id to the same run one signal: the first is
	// recorded, later ones are not (SignalResult.Duplicate), even after the first was consumed.
	// Use the sender's event id, so that a webhook delivered twice is one signal. 1 to 255
	// bytes; default "": every signal counts.
	DedupeID string
}

// SignalResult says what [Engine.SignalTx] recorded.
//
//	res, err := engine.SignalTx(ctx, tx, key, "approved", nil, nil)
//	log.Printf("signal #%d", res.Seq)
type SignalResult struct {
	// Seq is the signal's position among all signals; signals of one name to one run are
	// consumed in this order. 0 for a duplicate.
	Seq int64 `json:"seq"`

	// Duplicate is true when a signal with the same DedupeID was recorded for the run before;
	// nothing was added.
	Duplicate bool `json:"duplicate"`
}

// SignalTx sends the signal name with payload (encoded as JSON) to the run under key, as part
// of t: the signal is recorded in the run's mailbox, and the River job that wakes the run (when
// it is awaiting this signal now) is inserted, in t. So the signal exists if and only if t
// commits: a handler that writes an order row and signals the run commits both or neither.
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
//		if _, err := t.Exec(ctx, `UPDATE charges SET status = 'confirmed' WHERE id = $1`, ev.ChargeID); err != nil {
//			return err
//		}
//		_, err := engine.SignalTx(ctx, t, idem.Key{Scope: ev.Merchant, ID: ev.PayoutID}, "charge.confirmed", ev,
//			&workflow.SignalOpts{DedupeID: ev.ID})
//		return err
//	})
//
// Signals wait in the mailbox until an await (steps.Await) of their name consumes them, each
// exactly once, oldest first; one sent before the run reaches its await is kept for it. A run
// that is unknown gets ErrRunNotFound, one that has finished ErrRunFinished. It needs the
// engine's River client (see [Engine.SetClient]).
//
// A payload over Config.MaxSignalPayloadBytes, or a signal to a run with Config.MaxPendingSignals
// signals pending, is refused with a *LimitError (errors.Is(err, ErrLimitExceeded)), and nothing
// is recorded; t is still usable.
//
// SignalTx locks the run's row FOR KEY SHARE until t ends, which orders it with a run that is
// about to wait (see the README); keep t short, as for any transaction that touches a hot row.
func (e *Engine) SignalTx(ctx context.Context, t pgx.Tx, key idem.Key, name string, payload any, opts *SignalOpts) (*SignalResult, error) {
	if t == nil {
		return nil, errors.New("workflow: SignalTx needs a transaction; t is nil")
	}
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if name == "" || len(name) > 255 {
		return nil, errors.New("workflow: signal name must be 1 to 255 bytes")
	}
	var dedupe string
	if opts != nil && opts.DedupeID != "" {
		if len(opts.DedupeID) > 255 {
			return nil, fmt.Errorf("workflow: SignalOpts.DedupeID cannot be longer than 255 bytes (got %d)", len(opts.DedupeID))
		}
		dedupe = opts.DedupeID
	}
	data, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("workflow: error encoding signal payload of type %T as JSON: %w", payload, err)
	}
	if err := checkSize("MaxSignalPayloadBytes", fmt.Sprintf("the payload of signal %q", name), data, e.cfg.MaxSignalPayloadBytes); err != nil {
		return nil, err
	}
	jobs, err := e.jobs(ctx)
	if err != nil {
		return nil, err
	}
	sig, found, err := e.st.SignalSend(ctx, t, store.SignalParams{Scope: key.Scope, ID: key.ID, Name: name, Payload: data, DedupeID: dedupe,
		MaxPending: e.cfg.MaxPendingSignals})
	switch {
	case err != nil:
		return nil, fmt.Errorf("workflow: error recording signal: %w", e.tablesError(err))
	case !found:
		return nil, fmt.Errorf("%w: cannot signal %q to key %q in scope %q", ErrRunNotFound, name, key.ID, key.Scope)
	case sig.State.Finished():
		return nil, fmt.Errorf("%w: cannot signal %q to key %q in scope %q, which is %s", ErrRunFinished, name, key.ID, key.Scope, sig.State)
	case sig.Seq == nil && !sig.Duplicate && sig.Pending >= e.cfg.MaxPendingSignals:
		return nil, &LimitError{Field: "MaxPendingSignals", What: fmt.Sprintf("cannot signal %q", name), Size: sig.Pending, Max: e.cfg.MaxPendingSignals}
	}
	res := &SignalResult{Duplicate: sig.Seq == nil}
	if sig.Seq != nil {
		res.Seq = *sig.Seq
	}
	if sig.Awaits && sig.Seq != nil {
		// Only a recorded signal wakes the run (a duplicate has nothing for it). The job is
		// unique per suspension: a wake job of an earlier suspension at the same step, still
		// running in River after the run went back to waiting, must not swallow this one.
		args := WakeArgs{Scope: key.Scope, ID: key.ID, Generation: sig.Created, Seq: sig.WaitSeq, Reason: "signal", Suspended: sig.Suspended}
		if err := jobs.insertTx(ctx, t, args, e.signalWakeOpts()); err != nil {
			return nil, fmt.Errorf("workflow: error inserting the job that wakes the run: %w", err)
		}
	}
	return res, nil
}
