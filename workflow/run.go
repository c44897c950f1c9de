package workflow

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/keyctx"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/txctl"
)

// newToken makes a lease's fencing token. It is a pgtype.UUID rather than a uuid.UUID, which pgx
// would encode through its driver.Valuer (a string, a failed binary encode, a text scan) on
// every statement that presents it.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }

// runState is one process's ownership of one run, from taking the lease to giving it up. Steps
// reach it through the context the workflow function receives.
type runState struct {
	e       *Engine
	def     Definition
	scope   string
	id      string
	created int64       // created_at in microseconds: the run's generation, part of derived step keys
	token   pgtype.UUID // the lease's fencing token; pgtype's own type, which pgx encodes without detour
	attempt int
	history []stepRecord
	cancel  context.CancelCauseFunc

	deadline time.Time     // when the run times out, by this process's clock; zero for never
	timeout  time.Duration // RunOpts.Timeout, for a run whose row is not written yet
	dbNow    int64         // Postgres's clock when this process took the run, µs (see SleepStep)

	retryAfter time.Duration // for a suspended run: until its wake-up, as a hint to callers

	mu           sync.Mutex
	next         int           // seq of the next step, from 1
	busy         string        // name of the step in progress, "" when none
	stopErr      error         // the first error that stopped the run; no step runs after it
	pendingStart *pendingStart // the run's row, not committed yet (see fold.go)
	startHeld    bool          // the row is written in the held step's transaction
	startLost    bool          // a COMMIT that would have written the row was lost (see reload)

	// Owned by the goroutine that runs the workflow function.
	pending []txctl.Deferred // Call checkpoints waiting for the next transaction
	held    *heldStep        // a Tx step's transaction waiting to commit
}

type stepRecord struct {
	seq      int
	name     string
	kind     string
	output   []byte
	errMsg   *string
	attempts int
}

type runKey struct{}

func runFrom(ctx context.Context) (*runState, bool) {
	rs, ok := ctx.Value(runKey{}).(*runState)
	return rs, ok
}

// stop records the first error that ends this process's part in the run, and cancels the
// workflow's context so that whatever it is doing stops too.
func (rs *runState) stop(err error) error {
	rs.mu.Lock()
	if rs.stopErr == nil {
		rs.stopErr = err
	}
	err = rs.stopErr
	rs.mu.Unlock()
	if rs.cancel != nil {
		rs.cancel(err)
	}
	return err
}

func (rs *runState) stopped() error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.stopErr
}

// machineryError marks an error of the run's machinery rather than of the workflow's code: the
// run stops without a stored outcome and is resumed later.
type machineryError struct{ err error }

func (e *machineryError) Error() string { return e.err.Error() }
func (e *machineryError) Unwrap() error { return e.err }

// keyRow is a key, and its run if it has one, as the lookup statement reads it.
type keyRow struct {
	keyWorkflow *string // the workflow the key belongs to; nil for a key of idem.Do
	keyLive     bool    // Do's key: not expired
	state       *string // nil when the key has no run
	fingerprint []byte
	output      []byte
	input       []byte
	runLive     bool // running, or finished and not expired
	leaseLive   bool
	leaseLeft   int32 // seconds, rounded up
	attempts    int
	token       *pgtype.UUID
	created     int64
	lastError   string
	expiredFor  float64 // seconds since the lease expired (negative while live)
	trace       string
}

func (e *Engine) lookup(ctx context.Context, q store.Querier, key idem.Key) (keyRow, bool, error) {
	var r keyRow
	err := q.QueryRow(ctx, e.st.Runs.Lookup, key.Scope, key.ID).Scan(&r.keyWorkflow, &r.keyLive, &r.state, &r.fingerprint,
		&r.output, &r.input, &r.runLive, &r.leaseLive, &r.leaseLeft, &r.attempts, &r.token, &r.created, &r.lastError,
		&r.expiredFor, &r.trace)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("workflow: error looking up key: %w", err)
	}
	return r, true, nil
}

// reusable reports whether the key has finished and expired, so that a new run may take it.
func (r *keyRow) reusable() bool {
	if r.keyWorkflow == nil {
		return !r.keyLive
	}
	return r.state != nil && store.RunState(*r.state) != store.RunRunning && !r.runLive
}

// claimed says why a key that is not reusable cannot be started as a run of workflow name with
// this fingerprint: it belongs to Do, to another workflow, or to other input. nil if it is this
// run.
func (r *keyRow) claimed(name string, key idem.Key, fingerprint []byte) error {
	switch {
	case r.keyWorkflow == nil:
		return fmt.Errorf("%w: key %q in scope %q belongs to idem.Do, not to a run of workflow %q; use a key of its own for each (for example %q)",
			idem.ErrMismatch, key.ID, key.Scope, name, key.ID+":"+name)
	case *r.keyWorkflow != name:
		return fmt.Errorf("%w: key %q in scope %q belongs to a run of workflow %q, not %q; use a new key", idem.ErrMismatch, key.ID, key.Scope, *r.keyWorkflow, name)
	case r.state == nil:
		return fmt.Errorf("workflow: key %q in scope %q names a run of %q that has no row in idem_runs (was it deleted by hand?); delete the key's row in idem_keys too, or use a new key", key.ID, key.Scope, name)
	case r.fingerprint != nil && !bytes.Equal(r.fingerprint, fingerprint):
		return fmt.Errorf("%w: key %q in scope %q was first used with another input; use a new key for a new request", idem.ErrMismatch, key.ID, key.Scope)
	}
	return nil
}

// heldByDo refuses a run under a key that an idem.Do up the call stack holds: the Do's own write
// would collide with the run's at COMMIT, on every retry.
func (e *Engine) heldByDo(ctx context.Context, name string, key idem.Key) error {
	if keyctx.Held(ctx, e.cfg.Schema, key.Scope, key.ID) {
		return fmt.Errorf("%w: key %q in scope %q is held by the idem.Do (or idemhttp request) this run is started from, and a key belongs to one operation; give the run a key of its own, such as %q",
			idem.ErrMismatch, key.ID, key.Scope, key.ID+":"+name)
	}
	return nil
}

// runOrJoin is Workflow.Run without the types: start, replay, take over or report in flight,
// and with wait > 0, poll an in-flight run until it finishes or wait runs out.
func (e *Engine) runOrJoin(ctx context.Context, def Definition, key idem.Key, fingerprint, input []byte, wait, timeout time.Duration) ([]byte, bool, error) {
	poll := backoff.NewPoll(wait, 10*time.Millisecond, 250*time.Millisecond)
	for {
		out, replayed, err := e.tryRun(ctx, def, key, fingerprint, input, timeout)
		if wait <= 0 || !errors.Is(err, idem.ErrInFlight) {
			return out, replayed, err
		}
		again, serr := poll.Next(ctx)
		if serr != nil {
			return nil, false, fmt.Errorf("workflow: gave up waiting for run in flight: %w", serr)
		}
		if !again {
			return out, replayed, err
		}
	}
}

// tryRun settles one call: it runs the workflow (replayed false), or answers from what is stored
// (replayed true), or says why not.
func (e *Engine) tryRun(ctx context.Context, def Definition, key idem.Key, fingerprint, input []byte, timeout time.Duration) (out []byte, replayed bool, err error) {
	lease := e.cfg.Lease.Microseconds()
	timeoutArg := timeoutMicros(timeout)
	name := def.Name()
	trace := nullable(traceparent(ctx))
	// Each pass either settles the call or saw the row change under it (created by a
	// concurrent start, deleted by the reaper, taken over by another process); a handful of
	// passes is plenty.
	//
	// When runs fold (see fold.go) the first pass does not look the key up: it runs the
	// workflow, whose first step writes the run's row if the key is free, and a key that is
	// taken comes back as errKeyTaken, to be looked up on the next pass. A fresh run saves a
	// round trip; a call with a key that is taken runs the workflow's code up to its first step
	// (code that must be free of effects, like all the code between steps) before it is
	// answered.
	var startLost time.Time // when this call's own start was lost with its COMMIT (see reload)
	for pass := 0; pass < 5 || (!startLost.IsZero() && time.Since(startLost) < 5*time.Second); pass++ {
		token := newToken()
		var created int64
		var (
			row   keyRow
			found bool
			err   error
		)
		if pass > 0 || e.pool() == nil {
			if row, found, err = e.lookup(ctx, e.db, key); err != nil {
				return nil, false, err
			}
		}
		if !found && e.pool() != nil {
			// A new run. Its row is written with its first step (see fold.go); a key taken
			// meanwhile comes back as errKeyTaken, and is looked up again.
			rs := &runState{e: e, def: def, scope: key.Scope, id: key.ID, token: token, attempt: 1, next: 1, timeout: timeout,
				pendingStart: &pendingStart{fingerprint: fingerprint, input: input, trace: trace}}
			rs.startClock(0)
			out, err := e.execute(ctx, rs, input)
			if !errors.Is(err, errKeyTaken) {
				return out, false, err
			}
			if rs.startLost || !startLost.IsZero() {
				// The COMMIT that would have started the run never arrived, and the backend
				// of that transaction may still hold the key's lock while it goes away: the
				// key is taken by this call's own dead attempt, not by a duplicate. Give the
				// server a moment to release it, for up to five seconds.
				if startLost.IsZero() {
					startLost = time.Now()
				}
				if err := backoff.Sleep(ctx, 20*time.Millisecond); err != nil {
					return nil, false, fmt.Errorf("workflow: gave up waiting for the lock of a lost start: %w", err)
				}
			}
			continue
		}
		if !found {
			err := e.db.QueryRow(ctx, e.st.Runs.Start, key.Scope, key.ID, fingerprint, name, input, token, e.owner, lease, trace,
				store.LockID(e.cfg.Schema, key.Scope, key.ID), timeoutArg).Scan(&created)
			if errors.Is(err, pgx.ErrNoRows) {
				continue
			}
			if err != nil {
				return nil, false, fmt.Errorf("workflow: error starting run: %w", err)
			}
			rs := &runState{e: e, def: def, scope: key.Scope, id: key.ID, created: created, token: token, attempt: 1, next: 1, timeout: timeout}
			rs.startClock(created)
			out, err := e.execute(ctx, rs, input)
			return out, false, err
		}
		if row.reusable() {
			var leaseAt int64
			err := e.db.QueryRow(ctx, e.st.Runs.Replace, key.Scope, key.ID, fingerprint, name, input, token, e.owner, lease, trace, 1, true, timeoutArg).Scan(&created, &leaseAt)
			if errors.Is(err, pgx.ErrNoRows) {
				continue
			}
			if err != nil {
				return nil, false, fmt.Errorf("workflow: error reusing expired key: %w", err)
			}
			rs := &runState{e: e, def: def, scope: key.Scope, id: key.ID, created: created, token: token, attempt: 1, next: 1, timeout: timeout}
			rs.startClock(created)
			out, err := e.execute(ctx, rs, input)
			return out, false, err
		}
		if err := row.claimed(name, key, fingerprint); err != nil {
			return nil, false, err
		}
		state := store.RunState(*row.state)
		if state.Finished() {
			return storedOutcome(name, key, state, row.output)
		}
		switch state {
		case store.RunSleeping, store.RunAwaiting:
			// Waiting for a River job to wake it; whoever runs that job finishes the run.
			return nil, false, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: time.Second}
		}
		switch {
		case row.leaseLive:
			return nil, false, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: max(time.Second, time.Duration(row.leaseLeft)*time.Second)}
		case row.attempts >= e.cfg.MaxAttempts:
			// Out of attempts: the recovery jobs hand it to the reconcile hook.
			return nil, false, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: e.cfg.ScanInterval}
		}
		rs, stored, err := e.takeOver(ctx, def, key.Scope, key.ID, row.token, "call")
		if err != nil {
			return nil, false, err
		}
		if rs == nil {
			continue
		}
		e.log.InfoContext(ctx, "workflow: taking over run whose lease expired", "workflow", name, "scope", key.Scope, "id", key.ID,
			"attempt", rs.attempt, "lease_expired_for", time.Duration(row.expiredFor*float64(time.Second)).Round(time.Millisecond))
		out, err := e.execute(ctx, rs, stored)
		return out, false, err
	}
	return nil, false, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: time.Second}
}

// nullable turns "" into NULL.
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// takeOver takes the lease of a run whose lease expired, if it still has token old, and loads
// its history. It returns a nil runState when another process was faster.
// by says who takes it: "job" (a resume job) or "call" (a call of Workflow.Run).
func (e *Engine) takeOver(ctx context.Context, def Definition, scope, id string, old *pgtype.UUID, by string) (*runState, []byte, error) {
	rs, input, _, err := e.claim(ctx, def, scope, id, e.st.Runs.Takeover, func(token pgtype.UUID) []any {
		return []any{scope, id, token, old, e.cfg.Lease.Microseconds(), e.owner}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("workflow: error taking over run: %w", err)
	}
	if rs == nil {
		return nil, nil, nil
	}
	// The history is read after the lease is ours: no other process can add a step now, so the
	// history cannot grow behind our back.
	if rs.history, err = e.history(ctx, scope, id); err != nil {
		return nil, nil, err
	}
	e.countResume(ctx, def.Name(), by)
	return rs, input, nil
}

// claim takes a run's lease with stmt (Runs.Takeover or Waits.Wake, which both return
// store.ClaimReturning), given the new token by args. It returns a nil runState when the statement found
// nothing to take (another process was faster), and the run's input and trace context.
func (e *Engine) claim(ctx context.Context, def Definition, scope, id, stmt string, args func(token pgtype.UUID) []any) (*runState, []byte, string, error) {
	rs := &runState{e: e, def: def, scope: scope, id: id, token: newToken(), next: 1}
	var (
		input    []byte
		trace    string
		now      int64
		deadline *int64
	)
	err := e.db.QueryRow(ctx, stmt, args(rs.token)...).Scan(&rs.attempt, &input, &rs.created, &trace, &now, &deadline)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, "", nil
	}
	if err != nil {
		return nil, nil, "", err
	}
	rs.setClock(now, deadline)
	return rs, input, trace, nil
}

// history reads a run's completed steps.
func (e *Engine) history(ctx context.Context, scope, id string) ([]stepRecord, error) {
	rows, err := e.db.Query(ctx, e.st.Runs.History, scope, id)
	if err != nil {
		return nil, fmt.Errorf("workflow: error reading run history: %w", err)
	}
	history, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stepRecord, error) {
		var s stepRecord
		err := r.Scan(&s.seq, &s.name, &s.kind, &s.output, &s.errMsg, &s.attempts)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("workflow: error reading run history: %w", err)
	}
	for i, s := range history {
		if s.seq != i+1 {
			return nil, fmt.Errorf("workflow: history of key %q in scope %q has a gap at step #%d", id, scope, i+1)
		}
	}
	return history, nil
}

// execute runs the workflow function under rs's lease and stores how it ended. It returns the
// stored output, a *FailedError, or the error that stopped it without an outcome. A held step
// that could not commit for a reason a rerun fixes makes it start over from the committed
// history, in this process, a few times. A run cancelled under it returns a *CancelledError.
func (e *Engine) execute(ctx context.Context, rs *runState, input []byte) ([]byte, error) {
	out, err := e.executeRestarting(ctx, rs, input)
	return out, e.cancelledOutcome(ctx, rs, err)
}

func (e *Engine) executeRestarting(ctx context.Context, rs *runState, input []byte) ([]byte, error) {
	for restarts := 0; ; restarts++ {
		out, err := e.executeOnce(ctx, rs, input)
		if !errors.Is(err, errRestart) || restarts >= maxRestarts {
			if errors.Is(err, errRestart) {
				return nil, e.abandon(ctx, rs, &machineryError{err})
			}
			return out, err
		}
		out, finished, rerr := e.reload(ctx, rs)
		switch {
		case rerr != nil && (errors.Is(rerr, ErrFailed) || errors.Is(rerr, ErrCancelled) || errors.Is(rerr, ErrDeadlineExceeded)):
			return nil, rerr
		case rerr != nil:
			return nil, e.abandon(ctx, rs, &machineryError{rerr})
		case finished:
			return out, nil
		}
	}
}

func idemKey(rs *runState) idem.Key { return idem.Key{Scope: rs.scope, ID: rs.id} }

func (e *Engine) executeOnce(ctx context.Context, rs *runState, input []byte) ([]byte, error) {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rs.cancel = cancel
	runCtx = context.WithValue(runCtx, runKey{}, rs)

	stopHeartbeat := e.heartbeat(runCtx, rs)
	out, ferr := callSafely(runCtx, rs.def, input)
	stopHeartbeat()

	var mErr *machineryError
	switch stopped := rs.stopped(); {
	case errors.Is(stopped, errRestart), errors.Is(stopped, errKeyTaken):
		rs.rollbackHeld(ctx)
		return nil, stopped
	case errors.Is(stopped, errSuspended):
		rs.rollbackHeld(ctx) // nothing is held: the suspension committed what was
		return nil, rs.suspendedError()
	case errors.Is(stopped, errDeadline):
		return nil, rs.timeOut(ctx)
	case stopped != nil:
		return nil, e.abandon(ctx, rs, stopped)
	case context.Cause(runCtx) != nil:
		return nil, e.abandon(ctx, rs, context.Cause(runCtx))
	case errors.As(ferr, &mErr):
		return nil, e.abandon(ctx, rs, ferr)
	case rs.next-1 < len(rs.history):
		s := rs.history[rs.next-1]
		return nil, e.abandon(ctx, rs, &NonDeterminismError{Workflow: rs.def.Name(), Seq: s.seq, Stored: s.kind + ":" + s.name})
	}

	state, result := store.RunDone, out
	if ferr != nil {
		state, result = store.RunFailed, encodeFailure(ferr.Error())
	}
	if err := rs.finish(ctx, state, result); err != nil {
		rs.rollbackHeld(ctx)
		return nil, err
	}
	if ferr != nil {
		return nil, failedFromStored(rs.def.Name(), idem.Key{Scope: rs.scope, ID: rs.id}, result)
	}
	return out, nil
}

// abandon ends this process's part in a run without storing an outcome. The lease is left to
// expire, so the run is resumed by the recovery scan; for errors a retry will not fix by itself,
// the reason is recorded for the operator and the reconcile hook.
func (e *Engine) abandon(ctx context.Context, rs *runState, err error) error {
	rs.rollbackHeld(ctx)
	if !rs.started() {
		return fmt.Errorf("workflow: run of %q (key %q in scope %q) stopped before its first step could be written: %w", rs.def.Name(), rs.id, rs.scope, err)
	}
	if len(rs.pending) > 0 && !errors.Is(err, ErrLeaseLost) {
		// The Calls that completed are worth keeping: a resume then need not run them again.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		for _, d := range rs.pending {
			// Fenced here: on its own, the write must check the lease itself.
			if _, perr := e.db.Exec(sctx, e.st.Runs.Checkpoint, d.Args...); perr != nil {
				break
			}
		}
		cancel()
		rs.pending = nil
	}
	var nd *NonDeterminismError
	var mErr *machineryError
	if errors.As(err, &nd) || (errors.As(err, &mErr) && !errors.Is(err, ErrLeaseLost)) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, serr := e.db.Exec(sctx, e.st.Runs.Stuck, rs.scope, rs.id, rs.token, err.Error()); serr != nil {
			e.log.WarnContext(ctx, "workflow: error recording why a run stopped", "scope", rs.scope, "id", rs.id, "error", serr)
		}
	}
	if errors.Is(err, ErrLeaseLost) {
		// A cancel takes the lease away too; only the stored state tells it from a takeover.
		if cancelled := e.cancelledOutcome(ctx, rs, err); errors.Is(cancelled, ErrCancelled) {
			return cancelled
		}
		e.log.WarnContext(ctx, "workflow: run lost its lease and stopped; another process owns it now", "workflow", rs.def.Name(),
			"scope", rs.scope, "id", rs.id, "attempt", rs.attempt, "error", err)
	}
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNonDeterminism) {
		return err
	}
	return fmt.Errorf("workflow: run of %q (key %q in scope %q) stopped before its end and will be resumed: %w", rs.def.Name(), rs.id, rs.scope, err)
}

// callSafely turns a panic in the workflow function into an error that stops the run without
// failing it: a panic is a bug, and a deploy that fixes it should find the run still resumable.
func callSafely(ctx context.Context, def Definition, input []byte) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &machineryError{fmt.Errorf("workflow %q panicked: %v\n%s", def.Name(), r, debug.Stack())}
		}
	}()
	return def.call(ctx, input)
}

// heartbeat renews rs's lease every Lease/3 until the returned function is called. When the
// lease turns out to be lost, or cannot be renewed for a whole Lease (so another process may
// already have taken it), it stops the run: the fence would reject its next checkpoint anyway,
// and stopping early spares a Call step's duplicate effect.
func (e *Engine) heartbeat(ctx context.Context, rs *runState) (stop func()) {
	if e.heartbeatOff.Load() {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		interval := e.cfg.Lease / 3
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		renewed := time.Now()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			if !rs.committed() {
				renewed = time.Now() // nothing to renew yet: the run's row is not committed
				continue
			}
			sent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, interval)
			tag, err := e.db.Exec(rctx, e.st.Runs.Renew, rs.scope, rs.id, rs.token, e.cfg.Lease.Microseconds())
			cancel()
			switch {
			case err == nil && tag.RowsAffected() == 1:
				renewed = sent
			case err == nil:
				rs.stop(ErrLeaseLost)
				return
			case time.Since(renewed) >= e.cfg.Lease:
				rs.stop(fmt.Errorf("%w: it could not be renewed for %s: %w", ErrLeaseLost, e.cfg.Lease, err))
				return
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}
