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

	"github.com/idemkit/idem"
)

// runState is one process's ownership of one run, from taking the lease to giving it up. Steps
// reach it through the context the workflow function receives.
type runState struct {
	e       *Engine
	def     Definition
	scope   string
	id      string
	created int64 // created_at in microseconds: the run's generation, part of derived step keys
	token   uuid.UUID
	attempt int
	history []stepRecord
	cancel  context.CancelCauseFunc

	mu      sync.Mutex
	next    int    // seq of the next step, from 1
	busy    string // name of the step in progress, "" when none
	stopErr error  // the first error that stopped the run; no step runs after it
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

// keyRow is the run's row as the lookup statement reads it.
type keyRow struct {
	state         string
	workflow      *string
	fingerprint   []byte
	result        []byte
	input         []byte
	live          bool // not expired
	leaseLive     bool
	leaseLeft     int32 // seconds, rounded up
	attempts      int
	token         *uuid.UUID
	created       int64
	recoveryPoint string
	lastError     string
	expiredFor    float64 // seconds since the lease expired (negative while live)
}

func (e *Engine) lookup(ctx context.Context, key idem.Key) (keyRow, bool, error) {
	var r keyRow
	var leaseLive *bool
	err := e.db.QueryRow(ctx, e.st.lookup, key.Scope, key.ID).Scan(&r.state, &r.workflow, &r.fingerprint, &r.result, &r.input,
		&r.live, &leaseLive, &r.leaseLeft, &r.attempts, &r.token, &r.created, &r.recoveryPoint, &r.lastError, &r.expiredFor)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("workflow: error looking up key: %w", err)
	}
	r.leaseLive = leaseLive != nil && *leaseLive
	return r, true, nil
}

// runOrJoin is Workflow.Run without the types: start, replay, take over or report in flight,
// and with wait > 0, poll an in-flight run until it finishes or wait runs out.
func (e *Engine) runOrJoin(ctx context.Context, def Definition, key idem.Key, fingerprint, input []byte, wait time.Duration) ([]byte, error) {
	deadline := time.Now().Add(wait)
	pause := 10 * time.Millisecond
	for {
		out, err := e.tryRun(ctx, def, key, fingerprint, input)
		if wait <= 0 || !errors.Is(err, idem.ErrInFlight) {
			return out, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return out, err
		}
		if serr := sleepCtx(ctx, min(pause, left)); serr != nil {
			return nil, fmt.Errorf("workflow: gave up waiting for run in flight: %w", serr)
		}
		pause = min(pause*2, 250*time.Millisecond)
	}
}

func (e *Engine) tryRun(ctx context.Context, def Definition, key idem.Key, fingerprint, input []byte) ([]byte, error) {
	lease, ttl := e.cfg.Lease.Microseconds(), e.cfg.TTL.Microseconds()
	name := def.Name()
	// Each pass either settles the call or saw the row change under it (deleted by the reaper,
	// taken over by another process); a handful of passes is plenty.
	for range 5 {
		token := uuid.New()
		var created int64
		err := e.db.QueryRow(ctx, e.st.start, key.Scope, key.ID, fingerprint, name, input, token, lease, ttl).Scan(&created)
		if err == nil {
			return e.execute(ctx, &runState{e: e, def: def, scope: key.Scope, id: key.ID, created: created, token: token, attempt: 1, next: 1}, input)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("workflow: error starting run: %w", err)
		}

		row, found, err := e.lookup(ctx, key)
		if err != nil {
			return nil, err
		}
		if !found {
			continue
		}
		reusable := !row.live && row.state != "running"
		switch {
		case reusable:
			err := e.db.QueryRow(ctx, e.st.replace, key.Scope, key.ID, fingerprint, name, input, token, lease, ttl).Scan(&created)
			if errors.Is(err, pgx.ErrNoRows) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("workflow: error reusing expired key: %w", err)
			}
			return e.execute(ctx, &runState{e: e, def: def, scope: key.Scope, id: key.ID, created: created, token: token, attempt: 1, next: 1}, input)
		case row.workflow == nil:
			return nil, fmt.Errorf("%w: key %q in scope %q was used by idem.Do; use a new key for a workflow", idem.ErrMismatch, key.ID, key.Scope)
		case *row.workflow != name:
			return nil, fmt.Errorf("%w: key %q in scope %q belongs to workflow %q, not %q; use a new key", idem.ErrMismatch, key.ID, key.Scope, *row.workflow, name)
		case row.fingerprint != nil && !bytes.Equal(row.fingerprint, fingerprint):
			return nil, fmt.Errorf("%w: key %q in scope %q was first used with another input; use a new key for a new request", idem.ErrMismatch, key.ID, key.Scope)
		case row.state == "done":
			return row.result, nil
		case row.state == "failed":
			return nil, failedFromStored(name, key, row.result)
		case row.leaseLive:
			return nil, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: max(time.Second, time.Duration(row.leaseLeft)*time.Second)}
		case row.attempts >= e.cfg.MaxAttempts:
			// Out of attempts: the recovery jobs hand it to the reconcile hook.
			return nil, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: e.cfg.ScanInterval}
		}
		rs, stored, err := e.takeOver(ctx, def, key.Scope, key.ID, row.token)
		if err != nil {
			return nil, err
		}
		if rs == nil {
			continue
		}
		return e.execute(ctx, rs, stored)
	}
	return nil, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: time.Second}
}

// takeOver takes the lease of a run whose lease expired, if it still has token old, and loads
// its history. It returns a nil runState when another process was faster.
func (e *Engine) takeOver(ctx context.Context, def Definition, scope, id string, old *uuid.UUID) (*runState, []byte, error) {
	rs := &runState{e: e, def: def, scope: scope, id: id, token: uuid.New(), next: 1}
	var input []byte
	err := e.db.QueryRow(ctx, e.st.takeover, scope, id, rs.token, old, e.cfg.Lease.Microseconds()).Scan(&rs.attempt, &input, &rs.created)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("workflow: error taking over run: %w", err)
	}
	// The history is read after the lease is ours: no other process can add a step now, so the
	// history cannot grow behind our back.
	rows, err := e.db.Query(ctx, e.st.history, scope, id)
	if err != nil {
		return nil, nil, fmt.Errorf("workflow: error reading run history: %w", err)
	}
	rs.history, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (stepRecord, error) {
		var s stepRecord
		err := r.Scan(&s.seq, &s.name, &s.kind, &s.output, &s.errMsg, &s.attempts)
		return s, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("workflow: error reading run history: %w", err)
	}
	for i, s := range rs.history {
		if s.seq != i+1 {
			return nil, nil, fmt.Errorf("workflow: history of key %q in scope %q has a gap at step #%d", id, scope, i+1)
		}
	}
	return rs, input, nil
}

// execute runs the workflow function under rs's lease and stores how it ended. It returns the
// stored output, a *FailedError, or the error that stopped it without an outcome.
func (e *Engine) execute(ctx context.Context, rs *runState, input []byte) ([]byte, error) {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rs.cancel = cancel
	runCtx = context.WithValue(runCtx, runKey{}, rs)

	stopHeartbeat := e.heartbeat(runCtx, rs)
	out, ferr := callSafely(runCtx, rs.def, input)
	stopHeartbeat()

	var mErr *machineryError
	switch {
	case rs.stopped() != nil:
		return nil, e.abandon(ctx, rs, rs.stopped())
	case context.Cause(runCtx) != nil:
		return nil, e.abandon(ctx, rs, context.Cause(runCtx))
	case errors.As(ferr, &mErr):
		return nil, e.abandon(ctx, rs, ferr)
	case rs.next-1 < len(rs.history):
		s := rs.history[rs.next-1]
		return nil, e.abandon(ctx, rs, &NonDeterminismError{Workflow: rs.def.Name(), Seq: s.seq, Stored: s.kind + ":" + s.name})
	}

	state, result := "done", out
	if ferr != nil {
		state, result = "failed", encodeFailure(ferr.Error())
	}
	tag, err := e.db.Exec(ctx, e.st.finish, rs.scope, rs.id, rs.token, state, result, e.cfg.TTL.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("workflow: error storing the run's outcome (the run will be resumed and finished later): %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil, fmt.Errorf("workflow: error storing the run's outcome: %w", ErrLeaseLost)
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
	var nd *NonDeterminismError
	var mErr *machineryError
	if errors.As(err, &nd) || (errors.As(err, &mErr) && !errors.Is(err, ErrLeaseLost)) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, serr := e.db.Exec(sctx, e.st.stuck, rs.scope, rs.id, rs.token, err.Error()); serr != nil {
			e.log.WarnContext(ctx, "workflow: error recording why a run stopped", "scope", rs.scope, "id", rs.id, "error", serr)
		}
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
			sent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, interval)
			tag, err := e.db.Exec(rctx, e.st.renew, rs.scope, rs.id, rs.token, e.cfg.Lease.Microseconds())
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

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
