package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/txctl"
	"github.com/idemkit/idem/internal/txown"
	"github.com/idemkit/idem/tx"
)

// A run writes its bookkeeping in the round trips and commits its steps make anyway, when the
// engine's database is a *pgxpool.Pool (it holds connections of its own then):
//
//   - The run's row is inserted with the first Tx step's BEGIN, in that step's transaction; a
//     run whose first step is a Call (or that has no step) inserts it on its own first, because
//     a Call's derived key needs the run's creation time, committed.
//   - A Call's checkpoint goes with the next transaction: the next Tx step's, or the run's end.
//     A crash before then runs the Call again, with the same key (steps.Opts.CheckpointNow
//     writes it at once instead).
//   - A Tx step's transaction stays open until the run's next step or its end, so that the
//     run's outcome commits with its last step.
//
// So Tx, Call, Tx costs two commits and five round trips, where the same two transactions bare
// cost two and six.

// errKeyTaken stops a run whose creation found its key taken: the caller looks the key up and
// decides (replay, in flight, mismatch, takeover) as for any start.
var errKeyTaken = errors.New("workflow: the run's key was taken while it started")

// errRestart stops a run whose held step could not commit for a reason a rerun fixes (a
// serialization failure, a deadlock): the step's output has been handed to the workflow, so the
// run starts over from its committed history, in this process.
var errRestart = errors.New("workflow: a step's transaction failed to commit and the run starts over from its history")

// maxRestarts bounds the restarts of one execution; past it the run stops and is resumed later.
const maxRestarts = 5

// pendingStart is a run whose row is not written yet.
type pendingStart struct {
	fingerprint, input []byte
	trace              any
}

// heldStep is a Tx step's transaction, waiting for the run's next step to commit.
type heldStep struct {
	t       *txown.Tx
	release func()
	step    string
}

// pool returns the engine's pool, or nil when its DB is something else (and runs do not fold).
func (e *Engine) pool() *pgxpool.Pool {
	p, _ := e.db.(*pgxpool.Pool)
	return p
}

// started reports whether the run's row is written: committed, or in the held step's
// transaction, which commits it with the step.
func (rs *runState) started() bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.pendingStart == nil || rs.startHeld
}

// committed reports whether the run's row is committed, so that other transactions (a lease
// renewal, a takeover) can see it.
func (rs *runState) committed() bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.pendingStart == nil
}

// heldGone notes that the held transaction ended without committing: a start in it is pending
// again.
func (rs *runState) heldGone() {
	rs.mu.Lock()
	rs.startHeld = false
	rs.mu.Unlock()
}

func (rs *runState) startArgs(start *pendingStart) []any {
	e := rs.e
	return []any{rs.scope, rs.id, start.fingerprint, rs.def.Name(), start.input, rs.token, e.owner, e.cfg.Lease.Microseconds(), start.trace,
		store.LockID(e.cfg.Schema, rs.scope, rs.id), timeoutMicros(rs.timeout)}
}

// flushStart writes the run's row now, when it is still pending: before a step that is not a
// Tx step, and before any write of the run that is not in a transaction of its own.
func (rs *runState) flushStart(ctx context.Context) error {
	rs.mu.Lock()
	start := rs.pendingStart
	if rs.startHeld {
		start = nil // it commits with the held step
	}
	rs.mu.Unlock()
	if start == nil {
		return nil
	}
	var created int64
	err := rs.e.db.QueryRow(ctx, rs.e.st.Runs.Start, rs.startArgs(start)...).Scan(&created)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return rs.stop(errKeyTaken)
	case err != nil:
		return rs.stop(&machineryError{fmt.Errorf("workflow: error starting run: %w", err)})
	}
	rs.mu.Lock()
	rs.created, rs.pendingStart = created, nil
	rs.mu.Unlock()
	return nil
}

// boundary is called before each step: it commits a held step, and writes a pending start
// unless the step is a Tx step (which takes the start into its transaction).
func (rs *runState) boundary(ctx context.Context, inPostgres bool) error {
	if err := rs.commitHeld(ctx); err != nil {
		return err
	}
	if !inPostgres || rs.e.pool() == nil {
		return rs.flushStart(ctx)
	}
	return nil
}

// stepTx runs one attempt of a Tx step in a transaction of its own that the run holds: the
// pending start first (with BEGIN), the pending Call checkpoints and the step's checkpoint
// queued for COMMIT, which waits for the run's next step or end.
func (rs *runState) stepTx(ctx context.Context, s *StepInfo, body func(ctx context.Context, t pgx.Tx, info *StepInfo) ([]byte, error)) ([]byte, error) {
	e := rs.e
	conn, err := e.pool().Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("workflow: error acquiring a connection: %w", err)
	}
	t := txown.New(conn.Conn(), pgx.TxOptions{}, &txctl.Attempt{})
	held := false
	defer func() {
		if held {
			return
		}
		t.Close()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		t.RollbackNow(rctx)
		conn.Release()
	}()

	rs.mu.Lock()
	start := rs.pendingStart
	if rs.startHeld {
		start = nil
	}
	rs.mu.Unlock()
	startHere := false
	if start != nil {
		var created int64
		err := t.QueryRow(ctx, e.st.Runs.Start, rs.startArgs(start)...).Scan(&created)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, rs.stop(errKeyTaken)
		}
		if err != nil {
			return nil, fmt.Errorf("workflow: error starting run: %w", err)
		}
		rs.mu.Lock()
		rs.created = created
		rs.mu.Unlock()
		s.Key = stepKey(rs.scope, rs.id, created, s.Seq, s.Name)
		startHere = true
	}
	for _, d := range rs.pending {
		t.Attempt().Queue(d)
	}
	out, err := body(ctx, t, s)
	if err != nil {
		return nil, err
	}
	if err := rs.checkpointTx(ctx, t, s, out, nil); err != nil {
		return nil, err
	}
	held = true
	rs.held = &heldStep{t: t, release: conn.Release, step: s.Name}
	if startHere {
		rs.mu.Lock()
		rs.startHeld = true
		rs.mu.Unlock()
	}
	return out, nil
}

// commitHeld commits the held step's transaction, with extra writes queued last, and forgets
// what it wrote from the pending lists.
func (rs *runState) commitHeld(ctx context.Context, extra ...txctl.Deferred) error {
	h := rs.held
	if h == nil {
		return nil
	}
	rs.held = nil
	for _, d := range extra {
		h.t.Attempt().Queue(d)
	}
	err := h.t.CommitNow(ctx)
	h.t.Close()
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		h.t.RollbackNow(rctx)
		cancel()
	}
	h.release()
	if err == nil {
		rs.mu.Lock()
		rs.pendingStart, rs.startHeld, rs.pending = nil, false, nil
		rs.mu.Unlock()
		return nil
	}
	rs.heldGone()
	if stopped := rs.stopped(); stopped != nil {
		return stopped // a queued write's own mapping (a lost lease) has spoken
	}
	switch {
	case tx.IsRetryable(err), errors.Is(err, tx.ErrCommitUnknown) && !rs.e.dbGone(ctx):
		// The step's output has gone to the workflow already; its commit failed in a way a
		// rerun fixes, or may have landed: the run starts over from what is stored.
		return rs.stop(fmt.Errorf("%w: %w", errRestart, err))
	default:
		return rs.stop(&machineryError{fmt.Errorf("workflow: error committing step %q: %w", h.step, err)})
	}
}

// dbGone reports whether the database does not answer at all, so that starting over now is
// pointless and the run is better left to its lease.
func (e *Engine) dbGone(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := e.db.Exec(pctx, "SELECT 1")
	return err != nil
}

// reload prepares rs to run the workflow again from what is stored, after errRestart. It
// returns a non-nil outcome (output, or the stored failure) when the run turns out to be
// finished: a lost COMMIT that carried its outcome had landed.
func (e *Engine) reload(ctx context.Context, rs *runState) (out []byte, finished bool, err error) {
	key := idemKey(rs)
	row, found, err := e.lookup(ctx, e.db, key)
	if err != nil {
		return nil, false, err
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch {
	case !found || row.state == nil:
		if rs.pendingStart == nil {
			return nil, false, fmt.Errorf("workflow: run of key %q in scope %q is gone: %w", rs.id, rs.scope, ErrLeaseLost)
		}
		rs.history = nil // the start did not land: run it again
		rs.startLost = true
	case store.RunState(*row.state).Finished():
		return storedOutcome(rs.def.Name(), key, store.RunState(*row.state), row.output)
	case row.token == nil || *row.token != rs.token:
		return nil, false, fmt.Errorf("workflow: run of key %q in scope %q has another owner: %w", rs.id, rs.scope, ErrLeaseLost)
	default:
		rs.pendingStart, rs.created = nil, row.created
		rs.mu.Unlock()
		history, herr := e.history(ctx, rs.scope, rs.id)
		rs.mu.Lock()
		if herr != nil {
			return nil, false, herr
		}
		rs.history = history
	}
	rs.next, rs.busy, rs.stopErr, rs.startHeld = 1, "", nil, false
	rs.pending, rs.held = nil, nil
	return nil, false, nil
}

// rollbackHeld gives up the held step's transaction, if any: the run stops without it.
func (rs *runState) rollbackHeld(ctx context.Context) {
	h := rs.held
	if h == nil {
		return
	}
	rs.held = nil
	h.t.Close()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	h.t.RollbackNow(rctx)
	h.release()
	rs.heldGone()
}

// checkpointCall records a Call step's checkpoint: queued for the next transaction when the run
// folds, written now otherwise (or when the step asks for it).
func (rs *runState) checkpointCall(ctx context.Context, s *StepInfo, output []byte, errMsg *string, now bool) error {
	if now || rs.e.pool() == nil {
		return rs.checkpoint(ctx, s, output, errMsg)
	}
	// The next transaction fences itself (a Tx step's checkpoint, or the outcome), so this
	// write needs no fence of its own.
	rs.pending = append(rs.pending, txctl.Deferred{
		SQL:    rs.e.st.Runs.CheckpointInFenced,
		Args:   []any{rs.scope, rs.id, rs.token, s.Seq, s.Name, s.Kind, output, errMsg, s.Attempt},
		MapErr: func(err error) error { return rs.checkpointError(s, err) },
	})
	return nil
}

// finish stores the run's outcome: with the held step's COMMIT, or with the pending writes in a
// transaction of its own, or on its own. A lost lease is ErrLeaseLost.
func (rs *runState) finish(ctx context.Context, state store.RunState, result []byte) error {
	e := rs.e
	args := []any{rs.scope, rs.id, rs.token, string(state), result, e.cfg.TTL.Microseconds()}
	if !rs.started() {
		// A run with no step: its row, then its outcome.
		if err := rs.flushStart(ctx); err != nil {
			return err
		}
	}
	if rs.held == nil && len(rs.pending) == 0 {
		tag, err := e.db.Exec(ctx, e.st.Runs.Finish, args...)
		if err != nil {
			return fmt.Errorf("workflow: error storing the run's outcome (the run will be resumed and finished later): %w", err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("workflow: error storing the run's outcome: %w", ErrLeaseLost)
		}
		return nil
	}
	fin := txctl.Deferred{SQL: e.st.Runs.FinishFenced, Args: args, MapErr: func(err error) error {
		if store.IsFinishFenceError(err) {
			return rs.stop(fmt.Errorf("workflow: error storing the run's outcome: %w", ErrLeaseLost))
		}
		return err
	}}
	if rs.held == nil {
		// Pending writes and no held step: a transaction for them and the outcome, which
		// costs one round trip (BEGIN, the writes and COMMIT in one batch).
		if err := rs.holdEmpty(ctx); err != nil {
			return err
		}
	}
	if err := rs.commitHeld(ctx, fin); err != nil {
		if errors.Is(err, errRestart) {
			return err
		}
		return fmt.Errorf("workflow: error storing the run's outcome (the run will be resumed and finished later): %w", err)
	}
	return nil
}

// holdEmpty opens a held transaction with no step in it, for the pending writes.
func (rs *runState) holdEmpty(ctx context.Context) error {
	conn, err := rs.e.pool().Acquire(ctx)
	if err != nil {
		return rs.stop(&machineryError{fmt.Errorf("workflow: error acquiring a connection: %w", err)})
	}
	t := txown.New(conn.Conn(), pgx.TxOptions{}, &txctl.Attempt{})
	for _, d := range rs.pending {
		t.Attempt().Queue(d)
	}
	rs.held = &heldStep{t: t, release: conn.Release, step: "(end)"}
	return nil
}
