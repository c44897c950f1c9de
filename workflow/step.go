package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/txctl"
	"github.com/idemkit/idem/tx"
)

// Step defaults, used when the StepOpts field is zero.
//
//	opts := &steps.Opts{MaxAttempts: 2 * workflow.DefaultStepMaxAttempts}
const (
	DefaultStepMaxAttempts = 3
	DefaultStepMinBackoff  = 100 * time.Millisecond
	DefaultStepMaxBackoff  = 10 * time.Second
)

// StepOpts configure how a step retries within a run. nil means the defaults. Package steps
// passes them through; see steps.Opts.
//
//	steps.Call(ctx, "charge", charge, &workflow.StepOpts{MaxAttempts: 5, Timeout: 10 * time.Second})
type StepOpts struct {
	// MaxAttempts bounds how many times the step runs within one run before it fails for good
	// with a *StepError (which is stored, so a resumed run gets the same error). An error marked
	// permanent (it has a Retryable() bool method returning false, as steps.Permanent makes) is
	// not retried. Default 3; 1 means no retry.
	MaxAttempts int

	// MinBackoff and MaxBackoff bound the wait between attempts: a random duration up to
	// MinBackoff·2^(n-1), capped at MaxBackoff ("full jitter"). Defaults 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration

	// Timeout bounds each attempt; an attempt that runs out counts as failed. Default 0: no
	// bound beyond the workflow's context.
	Timeout time.Duration

	// CheckpointNow writes a Call step's checkpoint as soon as the step returns, in a statement
	// of its own, instead of with the run's next transaction. A crash then runs the Call again
	// only if it comes between the Call's effect and that statement; without it, until the
	// next transaction commits (the Call runs again with the same derived key either way). Set
	// it for outside services that do not honour idempotency keys. Tx steps ignore it: their
	// checkpoint always commits with their writes.
	CheckpointNow bool
}

func (o *StepOpts) withDefaults() (StepOpts, error) {
	var c StepOpts
	if o != nil {
		c = *o
	}
	switch {
	case c.MaxAttempts < 0:
		return c, fmt.Errorf("workflow: StepOpts.MaxAttempts cannot be negative (got %d)", c.MaxAttempts)
	case c.MinBackoff < 0 || c.MaxBackoff < 0 || c.Timeout < 0:
		return c, errors.New("workflow: StepOpts durations cannot be negative")
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultStepMaxAttempts
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultStepMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(DefaultStepMaxBackoff, c.MinBackoff)
	}
	if c.MaxBackoff < c.MinBackoff {
		return c, errors.New("workflow: StepOpts.MaxBackoff cannot be less than MinBackoff")
	}
	return c, nil
}

func (o *StepOpts) backoff(attempt int) time.Duration {
	return backoff.Jitter{Min: o.MinBackoff, Max: o.MaxBackoff}.Wait(attempt)
}

// StepInfo describes the step being run, for the step kinds in package steps.
//
//	workflow.RunStep(ctx, "call", "mail", nil, func(ctx context.Context, info *workflow.StepInfo) ([]byte, error) {
//		log.Printf("step %s #%d attempt %d key %s", info.Name, info.Seq, info.Attempt, info.Key)
//		return []byte("null"), nil
//	})
type StepInfo struct {
	Kind    string // "tx", "call", "enqueue", ...
	Name    string
	Seq     int    // position in the run, from 1
	Attempt int    // 1 for the first attempt within this process's part of the run
	Key     string // derived key; see StepKey

	rs            *runState
	checkpointNow bool
	branch        bool // a parallel branch (GoStep): it writes on its own, not through the run's transaction
}

// RiverClient returns the application's River client, for step kinds that insert jobs.
//
//	client, err := info.RiverClient(ctx)
//	_, err = client.InsertTx(ctx, tx, args, nil)
func (s *StepInfo) RiverClient(ctx context.Context) (*river.Client[pgx.Tx], error) {
	return s.rs.e.riverClient(ctx)
}

// StepKeyNamespace is the UUID namespace of derived step keys (see [StepKey]). It is a constant:
// changing it would change every derived key, and a step resumed after the change would hand
// the outside service a new key, and be applied twice.
//
//	key := uuid.NewSHA1(uuid.MustParse(workflow.StepKeyNamespace), data).String()
const StepKeyNamespace = "4230bd19-b1e3-5e84-8235-aedfa4a8cfc1"

var stepKeyNamespace = uuid.MustParse(StepKeyNamespace)

// StepKey is the idempotency key a step hands to an outside service: a name-based UUID
// (version 5, RFC 9562) in [StepKeyNamespace] over the run's key, the run's creation time in
// microseconds since the Unix epoch, the step's position and its name, joined by NUL bytes:
//
//	scope "\x00" id "\x00" created_at_µs "\x00" seq "\x00" name
//
// It is the same on every attempt and every resume of the step, differs between steps and
// between runs, and fits everywhere a UUID-shaped idempotency key is accepted. The creation time
// is in it so that a key reused after its TTL (a new run) does not collide with the old run's
// keys in a service that remembers them longer than we do.
//
//	key := workflow.StepKey(idem.Key{Scope: "merchant:7", ID: "req-1"}, createdAt, 2, "charge")
func StepKey(key idem.Key, runCreated time.Time, seq int, name string) string {
	return stepKey(key.Scope, key.ID, runCreated.UnixMicro(), seq, name)
}

func stepKey(scope, id string, created int64, seq int, name string) string {
	b := make([]byte, 0, len(scope)+len(id)+len(name)+40)
	b = append(b, scope...)
	b = append(b, 0)
	b = append(b, id...)
	b = append(b, 0)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, 0)
	b = strconv.AppendInt(b, int64(seq), 10)
	b = append(b, 0)
	b = append(b, name...)
	return uuid.NewSHA1(stepKeyNamespace, b).String()
}

// RunStep runs one step of kind whose work happens outside Postgres (steps.Call is built on
// it): body runs, with retries as opts say, and its output is then checkpointed, fenced by the
// run's lease, with the run's next transaction (or at once, with StepOpts.CheckpointNow). If the
// run's history already holds the step, body does not run and the stored output (or stored
// *StepError) is returned. Package steps is the intended caller; use it unless you are writing a
// new kind of step.
//
//	out, err := workflow.RunStep(ctx, "call", "charge", nil, func(ctx context.Context, info *workflow.StepInfo) ([]byte, error) {
//		return json.Marshal(charge(ctx, info.Key))
//	})
func RunStep(ctx context.Context, kind, name string, opts *StepOpts, body func(ctx context.Context, info *StepInfo) ([]byte, error)) ([]byte, error) {
	return runStep(ctx, kind, name, opts, false, func(ctx context.Context, s *StepInfo) ([]byte, error) {
		out, err := s.rs.e.callBody(name, body)(ctx, s)
		if err != nil {
			return nil, err
		}
		if err := s.rs.checkStepOutput(s, out); err != nil {
			return nil, err
		}
		if err := s.rs.checkpointCall(ctx, s, out, s.checkpointNow); err != nil {
			return nil, err
		}
		return out, nil
	})
}

// RunStepTx runs one step of kind whose work is a Postgres transaction (steps.Tx and
// steps.Enqueue are built on it): body runs in a transaction, and the step's checkpoint is
// written in the same transaction, fenced by the run's lease, so the step's writes commit
// exactly once. Postgres's serialization failures and deadlocks rerun the transaction (as
// tx.Run does); other errors are retried as opts say. If the run's history already holds the
// step, body does not run and the stored output is returned.
//
//	out, err := workflow.RunStepTx(ctx, "tx", "reserve", nil, func(ctx context.Context, t pgx.Tx, info *workflow.StepInfo) ([]byte, error) {
//		_, err := t.Exec(ctx, "UPDATE accounts SET held = held + 10 WHERE id = 1")
//		return []byte("null"), err
//	})
func RunStepTx(ctx context.Context, kind, name string, opts *StepOpts, body func(ctx context.Context, t pgx.Tx, info *StepInfo) ([]byte, error)) ([]byte, error) {
	return runStep(ctx, kind, name, opts, true, func(ctx context.Context, s *StepInfo) ([]byte, error) {
		return s.rs.stepTxRetrying(ctx, s, body)
	})
}

// runStep is the part all step kinds share: the place in the history, replay, retries, and
// telling the workflow's failures from the machinery's. inPostgres is true for the steps whose
// work is a Postgres transaction (RunStepTx): a lost connection there has not failed the step.
func runStep(ctx context.Context, kind, name string, opts *StepOpts, inPostgres bool, attempt func(ctx context.Context, s *StepInfo) ([]byte, error)) ([]byte, error) {
	c, err := claimStep(ctx, kind, name, opts, true)
	if err != nil || c.replayed {
		return c.output, err
	}
	defer c.rs.idle()
	rs := c.rs
	if err := rs.boundary(ctx, inPostgres); err != nil {
		return nil, err
	}
	ctx, span := rs.e.startStep(ctx, rs.rkey(), rs.def.Name(), kind, name, c.info.Seq, false)
	out, err := rs.attempts(ctx, c.info, &c.cfg, inPostgres, span, attempt)
	span.end(c.info.Attempt, err)
	return out, err
}

// claimedStep is a step whose position a call took: either replayed from the history (output
// and err are its stored outcome), or to be run (info, cfg).
type claimedStep struct {
	rs       *runState
	info     *StepInfo
	cfg      StepOpts
	replayed bool
	output   []byte
}

// claimStep is the part every step shares before it runs: the run, the step's position (taken
// at the call, in the order the workflow calls steps, so that replays are deterministic), and,
// when the history holds the position, the stored outcome instead. main says the step runs in
// the workflow's own line (the run is busy with it until idle), not as a parallel branch.
func claimStep(ctx context.Context, kind, name string, opts *StepOpts, main bool) (claimedStep, error) {
	rs, ok := runFrom(ctx)
	if !ok {
		return claimedStep{}, fmt.Errorf("workflow: step %q was called outside a workflow: ctx must be (or derive from) the context a workflow function receives", name)
	}
	c := claimedStep{rs: rs}
	if name == "" || len(name) > 255 {
		return c, errors.New("workflow: step name must be 1 to 255 bytes")
	}
	cfg, err := opts.withDefaults()
	if err != nil {
		return c, err
	}
	if cause := context.Cause(ctx); cause != nil {
		return c, rs.stop(cause)
	}
	if err := rs.inBranch(ctx, fmt.Sprintf("step %q", name)); err != nil {
		return c, err
	}

	rs.mu.Lock()
	if rs.end != nil {
		defer rs.mu.Unlock()
		return c, rs.end.err
	}
	if rs.busy != "" {
		busy := rs.busy
		rs.mu.Unlock()
		return c, rs.stop(&machineryError{fmt.Errorf("workflow: step %q was called while step %q is running; steps of a run must be called one at a time (steps.GoTx and steps.GoCall run steps beside the workflow), so that their order is the same on every resume", name, busy)})
	}
	seq := rs.next
	rs.next++
	if main {
		rs.busy = name
	}
	rs.mu.Unlock()

	rec, replayed, err := rs.match(seq, kind, name)
	if err != nil {
		if main {
			rs.idle()
		}
		return c, err
	}
	if replayed {
		if main {
			defer rs.idle()
		}
		c.replayed = true
		_, span := rs.e.startStep(ctx, rs.rkey(), rs.def.Name(), kind, name, seq, true)
		if rec.Error != nil {
			err := &StepError{Step: name, Seq: seq, Attempts: rec.Attempts, Message: *rec.Error}
			span.end(0, err)
			return c, err
		}
		span.end(0, nil)
		c.output = rec.Output
		return c, nil
	}

	if rs.deadlinePassed() {
		if main {
			rs.idle()
		}
		return c, rs.endWith(endDeadline, errDeadline)
	}
	c.cfg = cfg
	c.info = &StepInfo{Kind: kind, Name: name, Seq: seq, Key: stepKey(rs.scope, rs.id, rs.created, seq, name), rs: rs,
		checkpointNow: cfg.CheckpointNow, branch: !main}
	return c, nil
}

// idle ends the main line's step in progress.
func (rs *runState) idle() {
	rs.mu.Lock()
	rs.busy = ""
	rs.mu.Unlock()
}

// match is the history matching of every step, in a run's execution and in a replay: the
// history's record of position seq when it holds one of kind and name (replayed is true: the
// step is replayed from it), none when the history has nothing there (the step is new, or a
// parallel branch that did not complete, and runs), and a divergence, which stops the run, when
// the history holds another step there. In a replay, a step with nothing recorded ends the
// replay instead (pastHistory).
func (rs *runState) match(seq int, kind, name string) (rec store.StepRecord, replayed bool, err error) {
	rec, ok := rs.history.at(seq)
	if !ok {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		return rec, false, rs.pastHistory()
	}
	if rec.Kind != kind || rec.Name != name {
		return rec, false, rs.stop(&NonDeterminismError{Workflow: rs.def.Name(), Divergence: Divergence{Seq: seq, StoredKind: rec.Kind,
			StoredName: rec.Name, CalledKind: kind, CalledName: name}})
	}
	return rec, true, nil
}

// unconsumed is the divergence of an execution whose workflow function returned before it
// replayed the whole history, nil when it did.
func (rs *runState) unconsumed() *NonDeterminismError {
	rs.mu.Lock()
	next := rs.next
	rs.mu.Unlock()
	rec, ok := rs.history.from(next)
	if !ok {
		return nil
	}
	return &NonDeterminismError{Workflow: rs.def.Name(), Divergence: Divergence{Seq: rec.Seq, StoredKind: rec.Kind, StoredName: rec.Name}}
}

// attempts runs a step's attempts until one succeeds, the step fails for good (its failure is
// then checkpointed), or the run stops. Each failed attempt is recorded (see recordAttempt).
func (rs *runState) attempts(ctx context.Context, info *StepInfo, cfg *StepOpts, inPostgres bool, span *stepSpan, attempt func(ctx context.Context, s *StepInfo) ([]byte, error)) ([]byte, error) {
	for n := 1; ; n++ {
		info.Attempt = n
		actx, cancel := ctx, context.CancelFunc(func() {})
		if cfg.Timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		}
		started := time.Now()
		out, err := attempt(actx, info)
		cancel()
		if err == nil {
			span.attempt(ctx, started, "ok")
			return out, nil
		}
		if stop := rs.stopsRun(ctx, err, inPostgres); stop != nil {
			span.attempt(ctx, started, "stopped")
			span.failed(ctx, n, store.AttemptStopped, err)
			rs.recordStopped(ctx, info, err)
			return nil, stop
		}
		span.attempt(ctx, started, "error")
		outcome := store.AttemptRetried
		switch {
		case isPermanent(err):
			outcome = store.AttemptPermanent
		case n >= cfg.MaxAttempts:
			outcome = store.AttemptFailed
		}
		span.failed(ctx, n, outcome, err)
		if rerr := rs.recordAttempt(ctx, info, outcome, err); rerr != nil {
			return nil, rerr
		}
		if outcome != store.AttemptRetried {
			// The failure is the step's outcome: stored, so a resumed run gets it back.
			msg := err.Error()
			if info.branch {
				if cerr := rs.writeCheckpoint(ctx, rs.checkpointParams(info, nil, &msg)); cerr != nil {
					return nil, cerr
				}
			} else {
				rs.tx.queue(rs.checkpointParams(info, nil, &msg))
			}
			return nil, &StepError{Step: info.Name, Seq: info.Seq, Attempts: n, Message: msg}
		}
		span.retry(ctx, n, err)
		wait := cfg.backoff(n)
		if rs.e.seam.NoBackoff {
			wait = 0
		}
		if serr := backoff.Sleep(ctx, wait); serr != nil {
			return nil, rs.stop(context.Cause(ctx))
		}
	}
}

// stopsRun says whether a failed attempt's error stops the run rather than fail the attempt, and
// returns the error the step returns then.
func (rs *runState) stopsRun(ctx context.Context, err error, inPostgres bool) error {
	var mErr *machineryError
	switch {
	case rs.stopped() != nil:
		return rs.stopped()
	case context.Cause(ctx) != nil:
		return rs.stop(context.Cause(ctx))
	case errors.As(err, &mErr), errors.Is(err, tx.ErrCommitUnknown):
		return rs.stop(err)
	case inPostgres && tx.IsConnectionLost(err):
		// A step that works in Postgres and lost its connection has not failed: the run stops
		// unstored, its lease runs out, and the recovery worker resumes it from this step.
		// Storing the error would fail the run for good over a network blip.
		return rs.stop(err)
	}
	return nil
}

// maxAttemptError bounds the error text an attempt's row keeps.
const maxAttemptError = 2 << 10

// recordAttempt writes a failed attempt's row, so that an operator sees every attempt's error
// (RunGet, idem runs show), not only the last. When the step shares the run's start transaction,
// the row commits with the start: the run exists from here, and the next attempt runs in a
// transaction of its own.
func (rs *runState) recordAttempt(ctx context.Context, info *StepInfo, outcome store.AttemptOutcome, err error) error {
	shared := !rs.isCommitted()
	var rerr error
	if info.branch {
		// A branch writes on its own: the run's transaction belongs to the workflow's line.
		_, rerr = rs.e.st.StepAttempt(rs.attemptParams(info, outcome, err)).Exec(ctx, rs.e.db)
	} else {
		rerr = rs.tx.record(ctx, rs.e.st.StepAttempt(rs.attemptParams(info, outcome, err)))
	}
	switch {
	case rerr == nil:
		return nil
	case errors.Is(rerr, errStartTaken):
		return rs.endWith(endRestart, rerr)
	case shared:
		return rs.commitFailed(ctx, "the run's start with a failed attempt", rerr)
	}
	// The record is for the operator; the step goes on without it.
	rs.e.log.WarnContext(ctx, "workflow: error recording a failed attempt", "workflow", rs.def.Name(), "scope", rs.scope, rs.e.keys.Log(rs.rkey()),
		"step", info.Name, rs.e.keys.Error(rerr, rs.rkey()))
	return nil
}

// recordStopped records, as far as it can, the attempt during which the run stopped: the
// database may be what stopped it. A run whose start is not committed leaves nothing behind.
func (rs *runState) recordStopped(ctx context.Context, info *StepInfo, err error) {
	if !rs.isCommitted() || (!info.branch && rs.tx.open()) {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, _ = rs.e.st.StepAttempt(rs.attemptParams(info, store.AttemptStopped, err)).Exec(sctx, rs.e.db)
}

func (rs *runState) attemptParams(info *StepInfo, outcome store.AttemptOutcome, err error) store.AttemptParams {
	return store.AttemptParams{LeaseParams: rs.lease(), Seq: info.Seq, Name: info.Name, Kind: info.Kind, Attempt: info.Attempt,
		Outcome: outcome, Error: clipError(err.Error(), maxAttemptError), Keep: rs.e.cfg.StepAttemptsKept, Version: rs.e.cfg.Version}
}

// clipError cuts msg to at most n bytes, on a rune boundary, and says that it did.
func clipError(msg string, n int) string {
	if len(msg) <= n {
		return msg
	}
	const more = " …(clipped)"
	cut := n - len(more)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + more
}

// stepTx runs one attempt of a Tx step in the run's transaction (see runtx.go): body, then the
// step's checkpoint queued for COMMIT, which waits for the run's next step or end. A failed
// attempt's writes are undone.
func (rs *runState) stepTx(ctx context.Context, s *StepInfo, body func(ctx context.Context, t pgx.Tx, info *StepInfo) ([]byte, error)) ([]byte, error) {
	t, _, err := rs.tx.forStep(ctx)
	switch {
	case errors.Is(err, errStartTaken):
		return nil, rs.endWith(endRestart, err)
	case err != nil:
		return nil, err
	}
	out, err := body(ctx, t, s)
	if err == nil {
		err = rs.checkStepOutput(s, out) // then the step's writes are undone, as for any failure
	}
	if err == nil {
		rs.tx.hold(rs.checkpointParams(s, out, nil))
		return out, nil
	}
	rs.tx.undoStep(ctx)
	return nil, err
}

// stepTxRetrying runs a Tx step's attempt again when Postgres reports a serialization failure or
// deadlock, as tx.Run would.
func (rs *runState) stepTxRetrying(ctx context.Context, s *StepInfo, body func(ctx context.Context, t pgx.Tx, info *StepInfo) ([]byte, error)) ([]byte, error) {
	return rs.rerunOnConflict(ctx, func() ([]byte, error) { return rs.stepTx(ctx, s, body) })
}

// rerunOnConflict runs one attempt of a Tx step (attempt), again when Postgres reports a
// serialization failure or a deadlock, a few times.
func (rs *runState) rerunOnConflict(ctx context.Context, attempt func() ([]byte, error)) ([]byte, error) {
	retry := backoff.Jitter{Min: 5 * time.Millisecond, Max: 500 * time.Millisecond}
	for n := 1; ; n++ {
		out, err := attempt()
		if err == nil || !tx.IsRetryable(err) || n >= 10 || rs.stopped() != nil {
			return out, err
		}
		if serr := backoff.Sleep(ctx, retry.Wait(n)); serr != nil {
			return nil, err
		}
	}
}

// isPermanent reports whether err says it is not worth retrying: something in its chain has a
// Retryable() bool method that returns false (as steps.Permanent errors do).
func isPermanent(err error) bool {
	var r interface{ Retryable() bool }
	return errors.As(err, &r) && !r.Retryable()
}

// checkpointParams are the row of step s, built in one place for every kind of checkpoint.
func (rs *runState) checkpointParams(s *StepInfo, output []byte, errMsg *string) store.CheckpointParams {
	return store.CheckpointParams{LeaseParams: rs.lease(), Seq: s.Seq, Name: s.Name, Kind: s.Kind, Output: output, Error: errMsg,
		Attempts: s.Attempt, Created: rs.created}
}

// deferredCheckpoint is a checkpoint queued for COMMIT, whose failure stops the run (a lost
// lease) or reruns the transaction.
func (rs *runState) deferredCheckpoint(s store.Stmt, step string) txctl.Deferred {
	return txctl.Deferred{SQL: s.SQL, Args: s.Args, MapErr: func(err error) error { return rs.checkpointError(step, err) }}
}

// checkpointCall records a Call step's checkpoint: with the run's next transaction, or now (a
// statement of its own, fenced) when the step asks for it.
func (rs *runState) checkpointCall(ctx context.Context, s *StepInfo, output []byte, now bool) error {
	p := rs.checkpointParams(s, output, nil)
	if !now {
		rs.tx.queue(p)
		return nil
	}
	return rs.writeCheckpoint(ctx, p)
}

// writeCheckpoint writes a step's row now, fenced: one statement, so no transaction around it.
// If its acknowledgement is lost, the run stops and a resume reads the history to see whether it
// landed.
func (rs *runState) writeCheckpoint(ctx context.Context, p store.CheckpointParams) error {
	if _, err := rs.e.st.StepCheckpoint(p).Exec(ctx, rs.e.db); err != nil {
		if store.IsFenceError(err) {
			return rs.checkpointError(p.Name, err)
		}
		return rs.stop(&machineryError{fmt.Errorf("workflow: error writing checkpoint of step %q: %w", p.Name, err)})
	}
	return nil
}

// checkpointError turns a failed checkpoint into what stops (or retries) the step.
func (rs *runState) checkpointError(step string, err error) error {
	switch {
	case store.IsFenceError(err):
		return rs.stop(fmt.Errorf("workflow: step %q cannot be committed: %w", step, ErrLeaseLost))
	case tx.IsRetryable(err):
		return err // the transaction is run again
	}
	return &machineryError{fmt.Errorf("workflow: error writing checkpoint of step %q: %w", step, err)}
}

// storedFailure is the output of a run that did not finish as done: its error, and for a run the
// engine failed, why and where.
type storedFailure struct {
	Error      string        `json:"error"`
	Reason     FailureReason `json:"reason,omitempty"`
	Divergence *Divergence   `json:"divergence,omitempty"`
}

func encodeFailure(msg string) []byte {
	data, _ := json.Marshal(storedFailure{Error: msg}) // a struct of one string always encodes
	return data
}

func cancelledFromStored(name string, key idem.Key, result []byte) error {
	var f storedFailure
	if err := json.Unmarshal(result, &f); err != nil {
		f.Error = string(result)
	}
	return &CancelledError{Workflow: name, Scope: key.Scope, ID: key.ID, Reason: f.Error}
}

// storedOutcome is what a finished run answers from its stored outcome: its output when done,
// the error of its state otherwise. finished is false, and nothing else set, for a state that
// is not final.
func storedOutcome(name string, key idem.Key, state store.RunState, output []byte) (out []byte, finished bool, err error) {
	switch state {
	case store.RunDone:
		return output, true, nil
	case store.RunFailed:
		return nil, true, failedFromStored(name, key, output)
	case store.RunCancelled:
		return nil, true, cancelledFromStored(name, key, output)
	case store.RunTimedOut:
		return nil, true, timedOutFromStored(name, key, output)
	}
	return nil, false, nil
}

func failedFromStored(name string, key idem.Key, result []byte) error {
	var f storedFailure
	if err := json.Unmarshal(result, &f); err != nil {
		f.Error = string(result)
	}
	return &FailedError{Workflow: name, Scope: key.Scope, ID: key.ID, Message: f.Error, Reason: f.Reason, Divergence: f.Divergence}
}

// StopRun stops the run under ctx without storing an outcome, as a lost lease does, and returns
// err for the caller to pass up. Use it in a step kind for failures that a change of code, not
// a retry, must fix, such as a stored output that no longer decodes into the step's type: the
// run stays in progress, its history intact, and is resumed (or reconciled) later. Outside a
// workflow it returns err unchanged.
//
//	if err := json.Unmarshal(stored, &v); err != nil {
//		return v, workflow.StopRun(ctx, fmt.Errorf("stored output does not fit %T: %w", v, err))
//	}
func StopRun(ctx context.Context, err error) error {
	rs, ok := runFrom(ctx)
	if !ok || err == nil {
		return err
	}
	return rs.stop(&machineryError{err})
}
