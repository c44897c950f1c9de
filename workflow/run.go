package workflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/keyctx"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/telemetry"
	"github.com/idemkit/idem/internal/txctl"
	"github.com/idemkit/idem/tx"
)

// This file follows a run from Workflow.Run to its outcome: the start contract (tryRun), the
// execution of the workflow function (execute), and how an execution ends (its outcome). The
// package doc draws the states a run moves through; runtx.go has the run's open transaction.

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
	history stepHistory
	cancel  context.CancelCauseFunc

	// tx is the run's open transaction, and the writes that wait for one. Owned by the goroutine
	// that runs the workflow function.
	tx *runTx

	deadline time.Time     // when the run times out, by this process's clock; zero for never
	timeout  time.Duration // RunOpts.Timeout of a run this process starts
	started  time.Time     // when this process sent the start of a run it starts, by its clock
	dbNow    int64         // Postgres's clock when this process took the run, µs (see SleepStep)

	retryAfter time.Duration // for a suspended run: until its wake-up, as a hint to callers

	// replayOnly marks a replay (replay.go): the run's history is matched against its code, and
	// the execution ends where the code goes past the history, before anything runs or is written.
	replayOnly bool

	mu        sync.Mutex
	next      int            // seq of the next step, from 1
	patches   map[string]int // the change ids of Patched and Deprecated calls so far, with their positions
	busy      string         // name of the step in progress, "" when none
	end       *ending        // why this process's part in the run ended early; set once
	committed bool           // the run's row is committed, so that renewals and takeovers see it

	hasParent bool               // a child run: its final transaction wakes its parent
	conc      *store.Concurrency // its concurrency key: its final transaction starts a queued run of it

	branches branches // parallel branches in flight (see branch.go)
}

func (e *Engine) newRun(def Definition, scope, id string, token pgtype.UUID) *runState {
	rs := &runState{e: e, def: def, scope: scope, id: id, token: token, next: 1}
	rs.tx = &runTx{rs: rs}
	return rs
}

type runKey struct{}

func runFrom(ctx context.Context) (*runState, bool) {
	rs, ok := ctx.Value(runKey{}).(*runState)
	return rs, ok
}

func (rs *runState) lease() store.LeaseParams {
	return store.LeaseParams{Scope: rs.scope, ID: rs.id, Token: rs.token}
}

func (rs *runState) isCommitted() bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.committed
}

func (rs *runState) markCommitted() {
	rs.mu.Lock()
	rs.committed = true
	rs.mu.Unlock()
}

// endKind says why this process's part in a run ended before the workflow function returned on
// its own terms.
type endKind int

const (
	// endStopped: an error stopped it (a lost lease, a lost connection, a bug, a cancelled
	// context). No outcome is stored; the run is resumed later from its history.
	endStopped endKind = iota + 1
	// endSuspended: the run waits (a sleep, an await) and a River job continues it.
	endSuspended
	// endRestart: a held step's commit failed in a way that running again from the committed
	// history fixes (a serialization failure, a COMMIT whose answer was lost).
	endRestart
	// endDeadline: the run's deadline passed at a step boundary; it is stored as timed out.
	endDeadline
	// endReplayed: a replay reached the end of the run's history (see pastHistory).
	endReplayed
)

// ending is why an execution ended early: the first one recorded wins.
type ending struct {
	kind endKind
	err  error
}

// endWith records why this process's part in the run ends, unless something ended it already,
// and cancels the workflow's context so that whatever it is doing stops too. It returns the
// error of the ending that stands.
func (rs *runState) endWith(kind endKind, err error) error {
	end := rs.markEnded(kind, err)
	if rs.cancel != nil {
		rs.cancel(end.err)
	}
	return end.err
}

// markEnded records the ending without cancelling the workflow's context yet.
func (rs *runState) markEnded(kind endKind, err error) *ending {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.end == nil {
		rs.end = &ending{kind: kind, err: err}
	}
	return rs.end
}

// stop ends the execution with an error: nothing is stored, and the run is resumed later.
func (rs *runState) stop(err error) error { return rs.endWith(endStopped, err) }

func (rs *runState) ending() *ending {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.end
}

// stopped returns the error of the execution's ending, nil while it goes on.
func (rs *runState) stopped() error {
	if end := rs.ending(); end != nil {
		return end.err
	}
	return nil
}

// The errors that endings other than endStopped carry, which steps return to the workflow code.
var (
	errSuspended = errors.New("workflow: the run is waiting and will be woken by a River job")
	errRestart   = errors.New("workflow: a step's transaction failed to commit and the run starts over from its history")
	errDeadline  = errors.New("workflow: the run's deadline passed")
)

// machineryError marks an error of the run's machinery rather than of the workflow's code: the
// run stops without a stored outcome and is resumed later.
type machineryError struct{ err error }

func (e *machineryError) Error() string { return e.err.Error() }
func (e *machineryError) Unwrap() error { return e.err }

// Bounds of the start contract: the passes of one call (each settles it, or saw the key change
// under it), and how long a call waits for the in-flight lock of its own lost start.
const (
	maxPasses     = 5
	lostStartWait = 5 * time.Second
	maxRestarts   = 5 // restarts of one execution from its history; past it the run stops
)

// reusable reports whether the key has finished and expired, so that a new run may take it.
func reusable(kr store.KeyRun) bool {
	if kr.KeyWorkflow == nil {
		return !kr.KeyLive
	}
	return kr.State != nil && *kr.State != store.RunRunning && !kr.RunLive
}

// claimed says why a key that is not reusable cannot be started as a run of workflow name with
// this fingerprint: it belongs to Do, to another workflow, or to other input. nil if it is this
// run.
func claimed(kr store.KeyRun, name string, key idem.Key, fingerprint []byte) error {
	switch {
	case kr.KeyWorkflow == nil:
		return fmt.Errorf("%w: key %q in scope %q belongs to idem.Do, not to a run of workflow %q; use a key of its own for each (for example %q)",
			idem.ErrMismatch, key.ID, key.Scope, name, key.ID+":"+name)
	case *kr.KeyWorkflow != name:
		return fmt.Errorf("%w: key %q in scope %q belongs to a run of workflow %q, not %q; use a new key", idem.ErrMismatch, key.ID, key.Scope, *kr.KeyWorkflow, name)
	case kr.State == nil:
		return fmt.Errorf("workflow: key %q in scope %q names a run of %q that has no row in idem_runs (was it deleted by hand?); delete the key's row in idem_keys too, or use a new key", key.ID, key.Scope, name)
	case kr.Fingerprint != nil && !bytes.Equal(kr.Fingerprint, fingerprint):
		return fmt.Errorf("%w: key %q in scope %q was first used by workflow %q with another input; use a new key for a new request", idem.ErrMismatch, key.ID, key.Scope, name)
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
func (e *Engine) runOrJoin(ctx context.Context, def Definition, key idem.Key, fingerprint, input []byte, wait, timeout time.Duration, attrs map[string]string) ([]byte, bool, error) {
	poll := backoff.NewPoll(wait, 10*time.Millisecond, 250*time.Millisecond)
	for {
		out, replayed, err := e.tryRun(ctx, def, key, fingerprint, input, timeout, attrs)
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

// tryRun settles one call, the start contract: the run's first transaction opens with the key's
// in-flight lock, the run's row and a read of the key, in one round trip, and only a call that
// started the run (or took over one whose owner died) runs workflow code. A replay, a duplicate
// in flight and a mismatch are answered from that read, before any code runs. It returns the
// output (replayed false when this call produced it), or the stored failure, or why not.
func (e *Engine) tryRun(ctx context.Context, def Definition, key idem.Key, fingerprint, input []byte, timeout time.Duration, attrs map[string]string) (out []byte, replayed bool, err error) {
	name := def.Name()
	conc, err := def.concurrency(input)
	if err != nil {
		return nil, false, err
	}
	token := newToken() // one per call, so that a pass can recognise a start of an earlier pass that landed
	start := store.RunStartParams{Scope: key.Scope, ID: key.ID, Fingerprint: fingerprint, Workflow: name, Input: input, Token: token,
		Owner: e.owner, Lease: e.cfg.Lease, Trace: traceparent(ctx), Timeout: timeout, Concurrency: conc, Attributes: attrs,
		Version: e.cfg.Version}
	var lost time.Time // when a start of this call's was lost with its COMMIT (see below)
	inFlight := func(after time.Duration) error {
		return &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: max(time.Second, after)}
	}
	for pass := 0; ; pass++ {
		if pass >= maxPasses && (lost.IsZero() || time.Since(lost) >= lostStartWait) {
			return nil, false, inFlight(time.Second)
		}
		rs := e.newRun(def, key.Scope, key.ID, token)
		rs.started = e.now()
		row, err := rs.tx.startRun(ctx, start)
		if err != nil {
			return nil, false, fmt.Errorf("workflow: error starting run: %w", e.tablesError(err))
		}
		kr := row.KeyRun
		if !row.Started && row.Locked && kr.Found && reusable(kr) {
			// A key that finished and expired is a new key: the run takes it in the same
			// transaction, which holds its lock.
			r, ok, err := rs.tx.replace(ctx, store.RunReplaceParams{RunStartParams: start, Leased: true})
			if err != nil {
				rs.tx.rollback(ctx)
				return nil, false, fmt.Errorf("workflow: error reusing expired key: %w", err)
			}
			row.Started, row.Created = ok, r.Created
		}
		if row.Started && conc != nil {
			// A limited workflow decides under its key's lock whether the run may start, and
			// commits the decision before any code runs: a queued run waits, holding nothing.
			admitted, err := rs.tx.admitStart(ctx, name, *conc)
			switch {
			case err != nil:
				return nil, false, fmt.Errorf("workflow: error starting run: %w", err)
			case !admitted:
				return nil, false, inFlight(time.Second)
			}
			rs.conc = conc
		}
		if row.Started {
			rs.created, rs.attempt, rs.timeout = row.Created, 1, timeout
			rs.startClock(row.Created)
			res := e.execute(ctx, rs, input)
			if res.kind == outStartLost {
				// The COMMIT that would have started the run failed or was lost: start over.
				// If it was lost, its backend may hold the key's lock while it goes away, and
				// the next pass waits for that instead of calling it a duplicate.
				if lost.IsZero() {
					lost = time.Now()
				}
				continue
			}
			return res.output, false, res.err
		}
		rs.tx.rollback(ctx)

		switch {
		case !kr.Found || reusable(kr):
			if row.Locked {
				continue // written, or taken, after the statement's snapshot: look again
			}
			// Another transaction holds the key's lock: a start that has not committed yet, an
			// idem.Do running now, or the backend of a start of this call's that was lost.
			if !lost.IsZero() && time.Since(lost) < lostStartWait {
				if err := backoff.Sleep(ctx, 20*time.Millisecond); err != nil {
					return nil, false, fmt.Errorf("workflow: gave up waiting for the lock of a lost start: %w", err)
				}
				continue
			}
			return nil, false, inFlight(time.Second)
		}
		if err := claimed(kr, name, key, fingerprint); err != nil {
			return nil, false, err
		}
		state := *kr.State
		switch {
		case state.Finished():
			out, _, err := storedOutcome(name, key, state, kr.Output)
			return out, lost.IsZero(), err // after a lost COMMIT that landed, the outcome is this call's
		case kr.Token != nil && *kr.Token == token:
			// A start of an earlier pass did commit, without this call hearing of it: the run is
			// this call's, and goes on from its history.
			rs := e.newRun(def, key.Scope, key.ID, token)
			rs.created, rs.attempt, rs.conc = kr.Created, kr.Attempts, conc
			rs.markCommitted()
			rs.setClock(kr.Now, kr.Deadline)
			if rs.history, err = e.history(ctx, key.Scope, key.ID); err != nil {
				return nil, false, err
			}
			res := e.execute(ctx, rs, input)
			return res.output, false, res.err
		case state.Waiting(), state == store.RunQueued:
			// Waiting for a River job to wake it, or for a slot of its concurrency key; whoever
			// runs that job finishes the run.
			return nil, false, inFlight(time.Second)
		case kr.LeaseLive:
			return nil, false, inFlight(kr.LeaseLeft)
		case kr.Attempts >= e.cfg.MaxAttempts:
			// Out of attempts: the recovery jobs hand it to the reconcile hook.
			return nil, false, inFlight(e.cfg.ScanInterval)
		case !e.resumes(kr.Version):
			e.leaveToVersion(ctx, name, key.Scope, key.ID, kr.Version, "call")
			return nil, false, inFlight(e.cfg.ScanInterval)
		}
		rs, stored, err := e.takeOver(ctx, def, key.Scope, key.ID, kr.Token, "call")
		if err != nil {
			return nil, false, err
		}
		if rs == nil {
			continue // another process took it first
		}
		e.log.InfoContext(ctx, "workflow: taking over run whose lease expired", "workflow", name, "scope", key.Scope, e.keys.Log(rs.rkey()),
			"attempt", rs.attempt, "lease_expired_for", kr.ExpiredFor.Round(time.Millisecond))
		res := e.execute(ctx, rs, stored)
		return res.output, false, res.err
	}
}

// takeOver takes the lease of a run whose lease expired, if it still has token old, and loads
// its history. It returns a nil runState when another process was faster.
// by says who takes it: "job" (a resume job) or "call" (a call of Workflow.Run).
func (e *Engine) takeOver(ctx context.Context, def Definition, scope, id string, old *pgtype.UUID, by string) (*runState, []byte, error) {
	rs := e.newRun(def, scope, id, newToken())
	c, ok, err := e.st.RunTakeover(ctx, e.db, store.TakeoverParams{LeaseParams: rs.lease(), Old: old, Owner: e.owner, Lease: e.cfg.Lease,
		Version: e.cfg.Version})
	if err != nil {
		return nil, nil, fmt.Errorf("workflow: error taking over run: %w", err)
	}
	if !ok {
		return nil, nil, nil
	}
	rs.claimed(c)
	// The history is read after the lease is ours: no other process can add a step now, so the
	// history cannot grow behind our back.
	if rs.history, err = e.history(ctx, scope, id); err != nil {
		return nil, nil, err
	}
	e.countResume(ctx, def.Name(), by)
	return rs, c.Input, nil
}

// claimed sets up a run whose lease this process took (a takeover, a wake-up).
func (rs *runState) claimed(c store.Claim) {
	rs.attempt, rs.created, rs.hasParent, rs.conc = c.Attempts, c.Created, c.HasParent, c.Concurrency
	rs.markCommitted()
	rs.setClock(c.Now, c.Deadline)
}

// history reads a run's completed steps.
func (e *Engine) history(ctx context.Context, scope, id string) (stepHistory, error) {
	recs, err := e.st.RunHistory(ctx, e.db, scope, id)
	if err != nil {
		return stepHistory{}, fmt.Errorf("workflow: error reading run history: %w", err)
	}
	h := stepHistory{steps: make(map[int]store.StepRecord, len(recs))}
	for _, s := range recs {
		h.steps[s.Seq] = s
		h.last = max(h.last, s.Seq)
	}
	return h, nil
}

// stepHistory is a run's completed steps by position. Steps complete in the order the workflow
// calls them, but for parallel branches (steps.GoTx, steps.GoCall), which complete in any order:
// a run that stopped while a branch ran has a gap where the branch was, and the branch runs
// again on resume.
type stepHistory struct {
	steps map[int]store.StepRecord
	last  int // the highest position recorded
}

// at returns the step recorded at position seq.
func (h stepHistory) at(seq int) (store.StepRecord, bool) {
	s, ok := h.steps[seq]
	return s, ok
}

// from returns the first step recorded at position seq or after it: a run whose code returned
// before reaching it no longer matches its history.
func (h stepHistory) from(seq int) (store.StepRecord, bool) {
	for ; seq <= h.last; seq++ {
		if s, ok := h.steps[seq]; ok {
			return s, true
		}
	}
	return store.StepRecord{}, false
}

// outcomeKind is how an execution of a run ended.
type outcomeKind int

const (
	// outFinished: the run's outcome is stored, output for done, err for failed, cancelled or
	// timed out.
	outFinished outcomeKind = iota + 1
	// outSuspended: the run waits; err is an *idem.InFlightError.
	outSuspended
	// outStopped: nothing final is stored; err says why. A run whose row is committed is
	// resumed later; one whose start never committed is gone, and its key is free.
	outStopped
	// outRestart: a held step's commit failed in a way that running again from the history
	// fixes (execute does so).
	outRestart
	// outStartLost: the transaction that carried the run's start failed to commit, so the run
	// does not exist (or may exist, when its COMMIT's answer was lost): tryRun starts over.
	outStartLost
)

// outcome is what an execution of a run ends with: the explicit result that every way out of
// executeOnce returns.
type outcome struct {
	kind   outcomeKind
	output []byte
	err    error
}

func finished(output []byte, err error) outcome {
	return outcome{kind: outFinished, output: output, err: err}
}

// execute runs the workflow function under rs's lease until it has an outcome. A held step that
// could not commit for a reason a rerun fixes makes it start over from the committed history, in
// this process, a few times. A run cancelled under it ends with a *CancelledError.
func (e *Engine) execute(ctx context.Context, rs *runState, input []byte) outcome {
	for restarts := 0; ; restarts++ {
		out := e.executeOnce(ctx, rs, input)
		switch {
		case out.kind != outRestart:
			return out
		case !rs.isCommitted():
			return outcome{kind: outStartLost, err: out.err}
		case restarts >= maxRestarts:
			return e.abandon(ctx, rs, &machineryError{out.err})
		}
		if res, done := e.reload(ctx, rs); done {
			return res
		}
	}
}

func idemKey(rs *runState) idem.Key { return idem.Key{Scope: rs.scope, ID: rs.id} }

// rkey is the run's key as records concern it.
func (rs *runState) rkey() redact.Key { return redact.Key{Scope: rs.scope, ID: rs.id} }

// executeOnce calls the workflow function once, and stores how it ended: its output, its
// failure, a timeout. The function's own error is the run's failure only when nothing ended the
// execution first (rs.ending).
func (e *Engine) executeOnce(ctx context.Context, rs *runState, input []byte) outcome {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rs.cancel = cancel
	runCtx = context.WithValue(runCtx, runKey{}, rs)

	stopHeartbeat := e.heartbeat(runCtx, rs)
	out, panicked, ferr := callSafely(runCtx, rs.def, input)
	rs.drain() // branches still in flight write under the lease, which the heartbeat keeps
	stopHeartbeat()

	if panicked != nil && !rs.isCommitted() {
		// Nothing of the run is committed: roll its transaction back, so that the key is free
		// again, and let the panic go on, as it would from any function.
		rs.tx.rollback(ctx)
		panic(panicked)
	}
	var mErr *machineryError
	if end := rs.ending(); end != nil {
		switch end.kind {
		case endRestart:
			rs.tx.rollback(ctx)
			return outcome{kind: outRestart, err: end.err}
		case endSuspended:
			rs.tx.rollback(ctx) // nothing is open: the suspension committed what was
			return outcome{kind: outSuspended, err: rs.suspendedError()}
		case endDeadline:
			return rs.timeOut(ctx)
		}
		var nd *NonDeterminismError
		if errors.As(end.err, &nd) {
			return e.diverged(ctx, rs, nd)
		}
		return e.abandon(ctx, rs, end.err)
	}
	switch {
	case context.Cause(runCtx) != nil:
		return e.abandon(ctx, rs, context.Cause(runCtx))
	case errors.As(ferr, &mErr):
		return e.abandon(ctx, rs, ferr)
	}
	if nd := rs.unconsumed(); nd != nil {
		return e.diverged(ctx, rs, nd)
	}

	state, result := store.RunDone, out
	if ferr != nil {
		state, result = store.RunFailed, encodeFailure(ferr.Error())
	}
	if err := rs.finish(ctx, state, result); err != nil {
		if end := rs.ending(); end != nil && end.kind == endRestart {
			return outcome{kind: outRestart, err: end.err}
		}
		return e.abandon(ctx, rs, err)
	}
	if ferr != nil {
		return finished(nil, failedFromStored(rs.def.Name(), idemKey(rs), result))
	}
	return finished(out, nil)
}

// finish stores the run's outcome with the COMMIT of whatever is open (the last step's
// transaction, or one opened for it and the pending checkpoints). A lost lease is ErrLeaseLost.
func (rs *runState) finish(ctx context.Context, state store.RunState, result []byte) error {
	e := rs.e
	fin := e.st.RunFinish(store.RunFinishParams{LeaseParams: rs.lease(), State: state, Output: result, TTL: e.cfg.TTL})
	writes := []txctl.Deferred{{SQL: fin.SQL, Args: fin.Args, MapErr: func(err error) error {
		if store.IsFinishFenceError(err) {
			return rs.stop(fmt.Errorf("workflow: error storing the run's outcome: %w", ErrLeaseLost))
		}
		return err
	}}}
	timedOut := state == store.RunTimedOut
	if rs.hasParent || rs.conc != nil || timedOut {
		if !rs.tx.open() {
			if err := rs.tx.begin(ctx); err != nil {
				return rs.stop(&machineryError{err})
			}
		}
	}
	if rs.hasParent {
		// The parent's row is locked before this run's (whose fence goes with COMMIT), as the
		// parent's own transactions lock it, so the two never wait for each other in a circle.
		if err := e.wakeParent(ctx, rs.tx.view, rs.scope, rs.id); err != nil {
			rs.tx.rollback(ctx)
			return rs.stop(&machineryError{fmt.Errorf("workflow: error waking the parent run: %w", err)})
		}
	}
	if rs.conc != nil {
		// Its slot frees with this transaction: the oldest queued run of its key starts.
		if err := e.admit(ctx, rs.tx.view, rs.def.Name(), *rs.conc, rs.scope, rs.id); err != nil {
			rs.tx.rollback(ctx)
			return rs.stop(&machineryError{fmt.Errorf("workflow: error starting a queued run: %w", err)})
		}
	}
	if timedOut {
		// A parent that times out cancels its children, as a cancel does, and a child that held
		// a slot of its concurrency key hands it on (the run's own fence goes with COMMIT, so a
		// run that lost its lease rolls all of it back).
		children, err := e.st.RunCancelChildren(ctx, rs.tx.view, rs.scope, rs.id, encodeFailure(parentEndedMessage(idemKey(rs), state)), e.cfg.TTL)
		for _, c := range children {
			if err != nil {
				break
			}
			err = e.admitEnded(ctx, rs.tx.view, idem.Key{Scope: c.Scope, ID: c.ID}, c.WasQueued)
		}
		if err != nil {
			rs.tx.rollback(ctx)
			return rs.stop(&machineryError{fmt.Errorf("workflow: error cancelling the run's children: %w", err)})
		}
	}
	err := rs.tx.commitFenced(ctx, writes...)
	if err != nil {
		return rs.commitFailed(ctx, "(the run's outcome)", err)
	}
	return nil
}

// boundary is called before each step that runs (not one replayed from the history): it commits
// what the run's open transaction holds, unless the step is a Tx step and the transaction holds
// only the run's start, which the step shares. A Call's derived key needs the run's creation
// committed, and a wait commits on its own.
func (rs *runState) boundary(ctx context.Context, inPostgres bool) error {
	rt := rs.tx
	if !rt.open() || (inPostgres && rt.clean) {
		return nil
	}
	label := rt.step
	if label == "" {
		label = "(the run's start)"
	}
	if err := rt.commit(ctx); err != nil {
		return rs.commitFailed(ctx, label, err)
	}
	return nil
}

// commitFailed ends the execution after a failed COMMIT of the run's transaction, and returns why.
// The output of the step in it has gone to the workflow already: when the commit failed in a way
// a rerun fixes, or may have landed, the run starts over from what is stored.
func (rs *runState) commitFailed(ctx context.Context, label string, err error) error {
	if stopped := rs.stopped(); stopped != nil {
		return stopped // a queued write's own mapping (a lost lease) has spoken
	}
	if tx.IsRetryable(err) || (errors.Is(err, tx.ErrCommitUnknown) && !rs.e.dbGone(ctx)) {
		return rs.endWith(endRestart, fmt.Errorf("%w: %w", errRestart, err))
	}
	return rs.stop(&machineryError{fmt.Errorf("workflow: error committing %s: %w", label, err)})
}

// dbGone reports whether the database does not answer at all, so that starting over now is
// pointless and the run is better left to its lease.
func (e *Engine) dbGone(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := e.db.Exec(pctx, "SELECT 1")
	return err != nil
}

// reload prepares rs to run the workflow again from what is stored, after a restart. done is true
// when there is nothing to run again: the run turned out finished (a COMMIT that carried its
// outcome had landed), or no longer this process's.
func (e *Engine) reload(ctx context.Context, rs *runState) (outcome, bool) {
	kr, err := e.st.RunLookup(ctx, e.db, rs.scope, rs.id)
	if err != nil {
		return e.abandon(ctx, rs, &machineryError{fmt.Errorf("workflow: error looking up key: %w", err)}), true
	}
	switch {
	case !kr.Found || kr.State == nil:
		return e.abandon(ctx, rs, fmt.Errorf("workflow: run of key %q in scope %q is gone: %w", rs.id, rs.scope, ErrLeaseLost)), true
	case kr.State.Finished():
		out, _, err := storedOutcome(rs.def.Name(), idemKey(rs), *kr.State, kr.Output)
		return finished(out, err), true
	case kr.Token == nil || *kr.Token != rs.token:
		return e.abandon(ctx, rs, fmt.Errorf("workflow: run of key %q in scope %q has another owner: %w", rs.id, rs.scope, ErrLeaseLost)), true
	}
	history, err := e.history(ctx, rs.scope, rs.id)
	if err != nil {
		return e.abandon(ctx, rs, &machineryError{err}), true
	}
	rs.mu.Lock()
	rs.history, rs.created, rs.next, rs.busy, rs.end, rs.patches = history, kr.Created, 1, "", nil, nil
	rs.mu.Unlock()
	rs.tx.pending = nil
	return outcome{}, false
}

// diverged fails a run whose code no longer matches its history, at once: no retry can make it
// match, so the run is not left to its lease and MaxAttempts. Its stored failure says where it
// diverged and what to do; its history stays, so that a deploy with a patch can resume it.
func (e *Engine) diverged(ctx context.Context, rs *runState, nd *NonDeterminismError) outcome {
	result, _ := json.Marshal(storedFailure{Error: nd.Error(), Reason: FailureNondeterministic, Divergence: &nd.Divergence}) // always encodes
	if err := rs.finish(ctx, store.RunFailed, result); err != nil {
		return e.abandon(ctx, rs, err)
	}
	e.tel.Diverged.Add(ctx, 1, metric.WithAttributes(telemetry.Workflow.String(rs.def.Name())))
	e.log.WarnContext(ctx, "workflow: run's code diverged from its history; the run failed", "workflow", rs.def.Name(), "scope", rs.scope,
		e.keys.Log(rs.rkey()), "version", e.cfg.Version, "step", nd.Seq, "stored", nd.StoredKind+" "+nd.StoredName,
		"called", strings.TrimSpace(nd.CalledKind+" "+nd.CalledName), e.keys.Error(nd, rs.rkey()))
	return finished(nil, failedFromStored(rs.def.Name(), idemKey(rs), result))
}

// abandon ends this process's part in a run without storing an outcome. The lease is left to
// expire, so the run is resumed by the recovery scan; for errors a retry will not fix by itself,
// the reason is recorded for the operator and the reconcile hook. A run whose start never
// committed leaves nothing behind, and its key is free.
func (e *Engine) abandon(ctx context.Context, rs *runState, err error) outcome {
	rs.tx.rollback(ctx)
	if !rs.isCommitted() {
		return outcome{kind: outStopped, err: fmt.Errorf("workflow: run of %q (key %q in scope %q) stopped before its first step could be written; nothing of it was kept and its key is free: %w",
			rs.def.Name(), rs.id, rs.scope, err)}
	}
	if !errors.Is(err, ErrLeaseLost) {
		// The Calls that completed are worth keeping: a resume then need not run them again.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if ferr := rs.tx.flushFenced(sctx); ferr != nil {
			e.log.DebugContext(ctx, "workflow: error keeping the checkpoints of a stopped run", "scope", rs.scope, e.keys.Log(rs.rkey()),
				e.keys.Error(ferr, rs.rkey()))
		}
		cancel()
	}
	var mErr *machineryError
	if errors.As(err, &mErr) && !errors.Is(err, ErrLeaseLost) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if serr := e.st.RunStuck(sctx, e.db, rs.lease(), err.Error()); serr != nil {
			e.log.WarnContext(ctx, "workflow: error recording why a run stopped", "scope", rs.scope, e.keys.Log(rs.rkey()), e.keys.Error(serr, rs.rkey()))
		}
		cancel()
	}
	if errors.Is(err, ErrLeaseLost) {
		// A cancel takes the lease away too; only the stored state tells it from a takeover.
		if cancelled := e.cancelledOutcome(ctx, rs, err); errors.Is(cancelled, ErrCancelled) {
			return finished(nil, cancelled)
		}
		e.log.WarnContext(ctx, "workflow: run lost its lease and stopped; another process owns it now", "workflow", rs.def.Name(),
			"scope", rs.scope, e.keys.Log(rs.rkey()), "attempt", rs.attempt, e.keys.Error(err, rs.rkey()))
	}
	if errors.Is(err, ErrLeaseLost) {
		return outcome{kind: outStopped, err: err}
	}
	return outcome{kind: outStopped, err: fmt.Errorf("workflow: run of %q (key %q in scope %q) stopped before its end and will be resumed: %w",
		rs.def.Name(), rs.id, rs.scope, err)}
}

// callSafely calls the workflow function. A panic in it comes back as panicked, and as an error
// that stops the run without failing it: a panic is a bug, and a deploy that fixes it should find
// the run still resumable. (executeOnce lets a panic go on when nothing of the run is committed.)
func callSafely(ctx context.Context, def Definition, input []byte) (out []byte, panicked any, err error) {
	defer func() {
		if r := recover(); r != nil {
			panicked = r
			err = &machineryError{fmt.Errorf("workflow %q panicked: %v\n%s", def.Name(), r, debug.Stack())}
		}
	}()
	out, err = def.call(ctx, input)
	return out, nil, err
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
			if !rs.isCommitted() {
				renewed = time.Now() // nothing to renew yet: the run's row is not committed
				continue
			}
			sent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, interval)
			ok, err := e.st.RunRenew(rctx, e.db, rs.lease(), e.cfg.Lease)
			cancel()
			switch {
			case err == nil && ok:
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
