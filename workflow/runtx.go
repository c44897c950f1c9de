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
)

// A run has at most one open transaction at a time, and runTx owns it. Every write of the run
// goes through it:
//
//   - start: the run's first transaction opens with its start (BEGIN, the key's in-flight lock
//     and the run's row, in one round trip), before any workflow code runs;
//   - a Tx step runs in the open transaction when it holds only the start, and in a new one
//     otherwise; its checkpoint goes with COMMIT, and the transaction stays open ("held") until
//     the run's next step boundary, so that the run's outcome commits with its last step. The
//     checkpoint fences the run (locks its row under the lease's token) only when nothing else in
//     the transaction does: the start's transaction inserted the row, which no one else can see
//     until it commits, and the outcome's statement fences by itself (a row lock is a record in
//     the write-ahead log, one per checkpoint that takes it). A failed attempt of a first step that shares the start's transaction rolls it all back
//     (a savepoint would cost every run a subtransaction for a rare failure), and the start is
//     sent again before the next attempt, or with the failed attempt's record;
//   - a Call's checkpoint waits (pending) for the next transaction that commits;
//   - a wait step (sleep, await) runs in a transaction of its own, which it commits;
//   - the outcome is queued for the COMMIT of whatever is open, or of a transaction opened for it.
//
// So Tx, Call, Tx costs five round trips and two commits, where the same two transactions bare
// cost six and two.
//
// When the engine's DB is a *pgxpool.Pool, runTx holds a connection of its own and sends BEGIN
// and COMMIT in the round trips of the statements beside them (package txown). With any other
// DB it begins its transactions with DB.Begin, and sends each statement on its own: the same
// steps, in more round trips.

// errStartTaken is why a run whose start was rolled back with a failed attempt of its first step
// cannot go on: its key was taken meanwhile. The call starts over, and is answered as any call
// that finds the key taken.
var errStartTaken = errors.New("workflow: the run's key was taken while its first step was retried")

type runTx struct {
	rs *runState

	conn    *pgxpool.Conn // the pool's connection the open transaction holds; nil with another DB
	real    pgx.Tx        // the transaction once runTx has begun it itself (the start, another DB)
	own     *txown.Tx     // the pool path's view
	view    pgx.Tx        // what step bodies get; nil when no transaction is open
	attempt *txctl.Attempt

	start bool   // the open transaction carries the run's start: committing it makes the run exist
	step  string // the Tx step whose writes it holds, "" for none
	clean bool   // only the start is in it: a Tx step may share it

	held *store.CheckpointParams // the checkpoint of the Tx step the open transaction holds, sent with COMMIT

	params  store.RunStartParams     // the run's start, to be sent again after undoStep rolled it back
	resend  bool                     // the start was rolled back and must be sent again
	pending []store.CheckpointParams // Call checkpoints waiting for the next transaction that commits
}

// open reports whether a transaction is open.
func (rt *runTx) open() bool { return rt.view != nil }

// begin opens a transaction that holds nothing yet. On the pool path nothing is sent: BEGIN goes
// with its first statement.
func (rt *runTx) begin(ctx context.Context) error {
	e := rt.rs.e
	rt.attempt = &txctl.Attempt{}
	if pool := e.pool(); pool != nil {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("workflow: error acquiring a connection: %w", err)
		}
		rt.conn, rt.own = conn, txown.New(conn.Conn(), pgx.TxOptions{}, rt.attempt)
		rt.view = rt.own
		return nil
	}
	t, err := e.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("workflow: error beginning a transaction: %w", err)
	}
	rt.real, rt.view = t, &txown.Plain{Tx: t, Attempt: rt.attempt}
	return nil
}

// startRun opens the run's first transaction with its start: one round trip on the pool path.
// When the row says the run was not started (its key is taken), the transaction stays open
// holding nothing, for the caller to roll back or to replace the key in.
func (rt *runTx) startRun(ctx context.Context, p store.RunStartParams) (store.RunStartRow, error) {
	e := rt.rs.e
	rt.params = p
	start := e.st.RunStart(p)
	rt.attempt = &txctl.Attempt{}
	var (
		row store.RunStartRow
		err error
	)
	if pool := e.pool(); pool != nil {
		conn, aerr := pool.Acquire(ctx)
		if aerr != nil {
			return row, fmt.Errorf("workflow: error acquiring a connection: %w", aerr)
		}
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		b.Queue(start.SQL, start.Args...)
		br := conn.Conn().SendBatch(ctx, b)
		rt.conn, rt.real = conn, br.Tx()
		rt.own = txown.Begun(conn.Conn(), pgx.TxOptions{}, rt.attempt, rt.real)
		rt.view = rt.own
		row, err = readStart(br, true)
	} else {
		t, berr := e.db.Begin(ctx)
		if berr != nil {
			return row, fmt.Errorf("workflow: error beginning a transaction: %w", berr)
		}
		rt.real, rt.view = t, &txown.Plain{Tx: t, Attempt: rt.attempt}
		b := &pgx.Batch{}
		b.Queue(start.SQL, start.Args...)
		row, err = readStart(t.SendBatch(ctx, b), false)
	}
	if err != nil {
		rt.rollback(ctx)
		return row, err
	}
	rt.start, rt.clean = row.Started, row.Started
	return row, nil
}

// readStart reads the results of the start's batch: BEGIN's (when it began the transaction) and
// the start's row.
func readStart(br pgx.BatchResults, begins bool) (store.RunStartRow, error) {
	defer br.Close()
	if begins {
		if _, err := br.Exec(); err != nil {
			return store.RunStartRow{}, err
		}
	}
	row, err := store.ScanRunStart(br.QueryRow())
	if err != nil {
		return row, err
	}
	return row, br.Close()
}

// replace gives the open transaction's expired key (whose lock startRun took) to this run: from
// here the transaction carries the run's start.
func (rt *runTx) replace(ctx context.Context, p store.RunReplaceParams) (store.RunReplaced, bool, error) {
	r, ok, err := rt.rs.e.st.RunReplace(ctx, rt.real, p)
	if err != nil || !ok {
		return r, ok, err
	}
	rt.start, rt.clean = true, true
	return r, true, nil
}

// admitStart decides, under the concurrency key's lock, whether the run just started in the open
// transaction may run, and commits: the run then exists, running or queued.
func (rt *runTx) admitStart(ctx context.Context, workflow string, c store.Concurrency) (bool, error) {
	st := rt.rs.e.st
	lock, admit := st.ConcurrencyLockStmt(workflow, c.Key), st.RunAdmitStartStmt(rt.params.Scope, rt.params.ID, workflow, c)
	b := &pgx.Batch{}
	b.Queue(lock.SQL, lock.Args...)
	b.Queue(admit.SQL, admit.Args...)
	br := rt.real.SendBatch(ctx, b)
	_, err := br.Exec()
	var admitted bool
	if err == nil {
		admitted, err = store.ScanAdmitted(br.QueryRow())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		rt.rollback(ctx)
		return false, err
	}
	rt.clean = false // committed now; a Tx step opens a transaction of its own
	if err := rt.commit(ctx); err != nil {
		return false, err
	}
	return admitted, nil
}

// resendStart sends the run's start again after undoStep rolled it back. errStartTaken means the
// key was taken meanwhile.
func (rt *runTx) resendStart(ctx context.Context) error {
	if !rt.resend {
		return nil
	}
	row, err := rt.startRun(ctx, rt.params)
	if err != nil {
		return fmt.Errorf("workflow: error starting run again: %w", err)
	}
	if !row.Started {
		rt.rollback(ctx)
		return errStartTaken
	}
	// The run is inserted anew, with a created_at of this statement's: that is its generation
	// from here on (a wake-up job names it, and a large payload goes to its day's partition).
	rt.rs.created = row.Created
	rt.resend = false
	return nil
}

// forStep returns the transaction a Tx step's attempt runs in: the open one when it holds only
// the run's start (shared reports so), a new one otherwise. The boundary before the step has
// committed whatever else was open.
func (rt *runTx) forStep(ctx context.Context) (t pgx.Tx, shared bool, err error) {
	if err := rt.resendStart(ctx); err != nil {
		return nil, false, err
	}
	if rt.open() && rt.clean {
		return rt.view, true, nil
	}
	if rt.open() {
		return nil, false, fmt.Errorf("workflow: a transaction holding %q is still open at a step boundary", rt.step)
	}
	if err := rt.begin(ctx); err != nil {
		return nil, false, err
	}
	return rt.view, false, nil
}

// hold keeps the open transaction, with the step's checkpoint p to go with its COMMIT, until the
// run's next boundary. The checkpoint is queued at COMMIT, after whatever the step's body queued,
// when it is known whether another statement of the transaction fences the run.
func (rt *runTx) hold(p store.CheckpointParams) {
	rt.held, rt.step, rt.clean = &p, p.Name, false
}

// undoStep takes back what a failed attempt of a Tx step wrote: its transaction is rolled back.
// When the step shared the start's transaction, the start goes with it and is sent again before
// anything else (resendStart).
func (rt *runTx) undoStep(ctx context.Context) {
	if !rt.open() {
		return
	}
	if rt.clean {
		rt.resend = true
	}
	rt.rollback(ctx)
}

// queue keeps a Call's checkpoint for the next transaction that commits.
func (rt *runTx) queue(p store.CheckpointParams) { rt.pending = append(rt.pending, p) }

// commit commits the open transaction with the held step's checkpoint, the pending checkpoints
// and extra queued last, opening one for them when none is open (one round trip: BEGIN, the
// writes and COMMIT in a batch). Each queued write goes with a statement that fences the run (a
// Tx step's checkpoint, a wait's lock, flushFenced's checkpoints), or in the transaction that
// inserted the run's row, so the pending checkpoints need no fence of their own. On failure the
// transaction is rolled back and the pending checkpoints stay.
func (rt *runTx) commit(ctx context.Context, extra ...txctl.Deferred) error {
	return rt.commitWith(ctx, false, extra)
}

// commitFenced is commit for extra writes whose first statement fences the run by itself (the
// outcome's, which fails unless the writer holds the lease): they go first, and no checkpoint
// takes the run's row lock, one record less in the write-ahead log.
func (rt *runTx) commitFenced(ctx context.Context, extra ...txctl.Deferred) error {
	return rt.commitWith(ctx, true, extra)
}

func (rt *runTx) commitWith(ctx context.Context, fenced bool, extra []txctl.Deferred) error {
	if !rt.open() {
		if len(rt.pending) == 0 && len(extra) == 0 {
			return nil
		}
		if err := rt.begin(ctx); err != nil {
			return err
		}
	}
	st := rt.rs.e.st
	if fenced {
		// The fencing statement goes first, as a checkpoint's fence would: a writer that lost
		// the lease fails there at once, before a checkpoint's row could wait for the same row
		// of the run's new owner.
		for _, d := range extra {
			rt.attempt.Queue(d)
		}
	}
	if p := rt.held; p != nil {
		// A checkpoint made before the start was sent again names the run's new generation.
		p.Created = rt.rs.created
		// The start's transaction inserted the run's row, which no other transaction sees before
		// it commits: there is nothing to fence against.
		s := st.StepCheckpoint(*p)
		if fenced || rt.start {
			s = st.StepCheckpointInFenced(*p)
		}
		rt.attempt.Queue(rt.rs.deferredCheckpoint(s, p.Name))
		rt.held = nil
	}
	for _, p := range rt.pending {
		p.Created = rt.rs.created
		rt.attempt.Queue(rt.rs.deferredCheckpoint(st.StepCheckpointInFenced(p), p.Name))
	}
	if !fenced {
		for _, d := range extra {
			rt.attempt.Queue(d)
		}
	}
	var err error
	if rt.own != nil {
		err = rt.own.CommitNow(ctx)
	} else {
		err = rt.commitPlain(ctx)
	}
	carriedStart := rt.start
	rt.close(ctx, err != nil)
	if err != nil {
		return err
	}
	rt.pending = nil
	if carriedStart {
		rt.rs.markCommitted()
	}
	return nil
}

// commitPlain is commit with another DB than a pool: each queued write on its own, then COMMIT.
func (rt *runTx) commitPlain(ctx context.Context) error {
	for _, d := range rt.attempt.TakePending() {
		if _, err := rt.real.Exec(ctx, d.SQL, d.Args...); err != nil {
			if d.MapErr != nil {
				return d.MapErr(err)
			}
			return err
		}
	}
	if err := rt.real.Commit(ctx); err != nil {
		wrapped, _ := txown.CommitError(err)
		return wrapped
	}
	return nil
}

// flushFenced commits the pending checkpoints in a transaction of their own, each fenced (no
// other statement fences them here), for a run that stops before its next transaction.
func (rt *runTx) flushFenced(ctx context.Context) error {
	if len(rt.pending) == 0 {
		return nil
	}
	st := rt.rs.e.st
	extra := make([]txctl.Deferred, 0, len(rt.pending))
	for _, p := range rt.pending {
		extra = append(extra, rt.rs.deferredCheckpoint(st.StepCheckpoint(p), p.Name))
	}
	rt.pending = nil
	return rt.commit(ctx, extra...)
}

// record writes a failed attempt's row: with the start, when the step shared the start's
// transaction (which is sent again, and commits: a failed attempt is worth keeping, and the next
// attempt runs in a transaction of its own), on its own otherwise.
func (rt *runTx) record(ctx context.Context, s store.Stmt) error {
	if err := rt.resendStart(ctx); err != nil {
		return err
	}
	if rt.open() && rt.clean {
		return rt.commit(ctx, txctl.Deferred{SQL: s.SQL, Args: s.Args})
	}
	_, err := s.Exec(ctx, rt.rs.e.db)
	return err
}

// rollback ends the open transaction, if any, without committing it.
func (rt *runTx) rollback(ctx context.Context) { rt.close(ctx, true) }

// close ends the view and gives the connection back, rolling the transaction back first when
// told (after a failed COMMIT, the server has already ended it).
func (rt *runTx) close(ctx context.Context, rollback bool) {
	if rt.view == nil && rt.conn == nil && rt.real == nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	switch {
	case rt.own != nil:
		rt.own.Close()
		if rollback {
			rt.own.RollbackNow(rctx)
		}
	case rt.conn != nil:
		// The start's batch failed before a view was made.
		txown.New(rt.conn.Conn(), pgx.TxOptions{}, nil).RollbackNow(rctx)
	case rt.real != nil && rollback:
		if err := rt.real.Rollback(rctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			rt.rs.e.log.DebugContext(ctx, "workflow: error rolling back a run's transaction", "error", err)
		}
	}
	if rt.conn != nil {
		rt.conn.Release()
	}
	rt.conn, rt.real, rt.own, rt.view, rt.attempt = nil, nil, nil, nil, nil
	rt.start, rt.step, rt.clean, rt.held = false, "", false, nil
}
