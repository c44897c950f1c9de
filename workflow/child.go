package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

// A child run is a run of a registered workflow that a step of another run (its parent) starts:
// the start is the parent's step, in the step's transaction, so a replay never starts a child
// twice; the child is a run of its own (its own key, lease, history, outcome), resumed and
// operated like any other. A parent that waits for a child holds nothing while it waits: it is
// suspended as an await is, and the child's final transaction inserts the job that wakes it.

// ChildOpts are options for starting a child run (see [Workflow.StartChild]). nil means the
// defaults.
//
//	receipt, err := Charge.RunChild(ctx, "charge", req, &workflow.ChildOpts{Timeout: time.Hour})
type ChildOpts struct {
	// ID is the child's key in its parent's scope. Default: derived from the parent's run and
	// the step (as [StepKey] is), which is what a child needs unless an outside party must find it
	// by a key of its own.
	ID string

	// Abandon leaves the child running when its parent is cancelled or times out. By default a
	// parent's cancel (or timeout) cancels its unfinished children, and theirs. A parent that
	// ends done or failed leaves its unfinished children running either way.
	Abandon bool

	// Timeout gives the child a deadline, as RunOpts.Timeout does for a run. Default 0: none.
	Timeout time.Duration
}

// ChildRun is a child run a step started: [Workflow.StartChild] returns it, and [ChildRun.Wait]
// waits for its outcome.
//
//	child, err := Ship.StartChild(ctx, "ship", order, nil)
//	... // other steps, while the shipment runs
//	label, err := child.Wait(ctx, "ship-done")
type ChildRun[Out any] struct {
	Workflow string   `json:"workflow"`
	Key      idem.Key `json:"key"` // the child's key: RunGet, Workflow.Get and RunCancel take it
}

// childRef is the stored output of a child's start step.
type childRef struct {
	Workflow string `json:"workflow"`
	Scope    string `json:"scope"`
	ID       string `json:"id"`
}

// StartChild starts a run of w as a child of the run under ctx, in a step named step, and
// returns it without waiting: the child starts (through a River resume job) once the step's
// transaction commits, in whichever process works the job. A replay returns the same child and
// starts nothing. Wait for its outcome with [ChildRun.Wait], in a later step.
//
// w must be registered with the engine that runs the parent; an unregistered workflow stops the
// parent's run at the call with an error that says so (the run is resumed once a deploy
// registers it). A child under the parent's own key is refused.
//
//	child, err := Ship.StartChild(ctx, "ship", order, &workflow.ChildOpts{Abandon: true})
func (w *Workflow[In, Out]) StartChild(ctx context.Context, step string, in In, opts *ChildOpts) (*ChildRun[Out], error) {
	rs, ok := runFrom(ctx)
	if !ok {
		return nil, fmt.Errorf("workflow: child %q was started outside a workflow: ctx must be (or derive from) the context a workflow function receives", step)
	}
	if opts == nil {
		opts = &ChildOpts{}
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("workflow: ChildOpts.Timeout cannot be negative (got %s)", opts.Timeout)
	}
	if d, ok := rs.e.workflows[w.name]; !ok || d != Definition(w) {
		return nil, StopRun(ctx, fmt.Errorf("workflow: child workflow %q is not registered with this engine; add it to Config.Workflows of every process that runs %q", w.name, rs.def.Name()))
	}
	if opts.ID != "" {
		if err := (idem.Key{Scope: rs.scope, ID: opts.ID}).Validate(); err != nil {
			return nil, fmt.Errorf("workflow: ChildOpts.ID: %w", err)
		}
		if opts.ID == rs.id {
			return nil, StopRun(ctx, fmt.Errorf("%w: a child cannot run under its parent's own key %q; leave ChildOpts.ID empty for a derived key", idem.ErrMismatch, rs.id))
		}
	}
	input, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("workflow: error encoding input of child %q (type %T) as JSON: %w", step, in, err)
	}
	if err := rs.e.checkInput(w.name, input); err != nil {
		return nil, err
	}
	closeRule := store.ParentCancel
	if opts.Abandon {
		closeRule = store.ParentAbandon
	}
	out, err := RunStepTx(ctx, "child", step, nil, func(ctx context.Context, t pgx.Tx, info *StepInfo) ([]byte, error) {
		e := rs.e
		key := idem.Key{Scope: rs.scope, ID: opts.ID}
		if key.ID == "" {
			key.ID = info.Key
		}
		jobs, err := e.jobs(ctx)
		if err != nil {
			return nil, StopRun(ctx, err)
		}
		fingerprint := idem.Fingerprint("idem.workflow.input", w.name, string(input))
		conc, err := w.concurrency(input)
		if err != nil {
			return nil, &permanent{err}
		}
		started, err := e.enqueue(ctx, jobs, t, store.RunEnqueueParams{Scope: key.Scope, ID: key.ID, Fingerprint: fingerprint,
			Workflow: w.name, Input: input, Trace: traceparent(ctx), Timeout: opts.Timeout,
			Parent: &store.ParentRef{Scope: rs.scope, ID: rs.id, Seq: info.Seq, Close: closeRule}, Concurrency: conc,
			Version: e.cfg.Version}, resumeChild)
		if err != nil {
			return nil, fmt.Errorf("error starting child: %w", err)
		}
		if !started {
			// Only a key of its own can be taken: it is another operation's.
			kr, err := e.st.RunLookup(ctx, t, key.Scope, key.ID)
			if err != nil {
				return nil, fmt.Errorf("error looking up the child's key: %w", err)
			}
			if !kr.Found {
				// Another transaction holds the key's lock: it may yet take the key, or not.
				return nil, &idem.InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: time.Second}
			}
			if cerr := claimed(kr, w.name, key, fingerprint); cerr != nil || !reusable(kr) {
				if cerr == nil {
					cerr = fmt.Errorf("%w: key %q in scope %q already has a run; give the child a key of its own", idem.ErrMismatch, key.ID, key.Scope)
				}
				return nil, &permanent{cerr}
			}
			return nil, &permanent{fmt.Errorf("%w: key %q in scope %q was used before and has expired; give the child a new key", idem.ErrMismatch, key.ID, key.Scope)}
		}
		return json.Marshal(childRef{Workflow: w.name, Scope: key.Scope, ID: key.ID})
	})
	if err != nil {
		return nil, err
	}
	var ref childRef
	if err := json.Unmarshal(out, &ref); err != nil {
		return nil, StopRun(ctx, fmt.Errorf("workflow: stored output of child step %q cannot be decoded: %w", step, err))
	}
	return &ChildRun[Out]{Workflow: ref.Workflow, Key: idem.Key{Scope: ref.Scope, ID: ref.ID}}, nil
}

// RunChild is [Workflow.StartChild] and [ChildRun.Wait] in one call: it starts the child in the
// step named step and waits for its outcome in a second step of the same name. The parent holds
// nothing while it waits.
//
//	label, err := Ship.RunChild(ctx, "ship", order, nil)
//	if errors.Is(err, workflow.ErrFailed) {
//		return Receipt{}, fmt.Errorf("shipping failed: %w", err)
//	}
func (w *Workflow[In, Out]) RunChild(ctx context.Context, step string, in In, opts *ChildOpts) (Out, error) {
	child, err := w.StartChild(ctx, step, in, opts)
	if err != nil {
		var zero Out
		return zero, err
	}
	return child.Wait(ctx, step)
}

// childOutcome is a child-wait step's stored output: the child's final state and its output, or
// its stored failure.
type childOutcome struct {
	State  store.RunState  `json:"state"`
	Output json.RawMessage `json:"output,omitempty"`
}

// Wait waits, in a step named step of the run under ctx, for the child's outcome, and returns
// its output. While the child is unfinished the parent is suspended (as an await is: no lease,
// no goroutine, no connection); the child's final transaction wakes it. The outcome is the
// step's checkpoint, so a replay returns the same. A child that failed, was cancelled or timed
// out returns its *FailedError, *CancelledError or *TimedOutError (errors.Is with ErrFailed,
// ErrCancelled, ErrDeadlineExceeded).
//
//	label, err := child.Wait(ctx, "ship-done")
func (c *ChildRun[Out]) Wait(ctx context.Context, step string) (Out, error) {
	var zero Out
	out, err := runStep(ctx, "child-wait", step, nil, false, func(ctx context.Context, s *StepInfo) ([]byte, error) {
		rs := s.rs
		var rec []byte
		err := rs.waitTx(ctx, step, func(t pgx.Tx, w *store.WaitRow) (bool, error) {
			// After the parent's lock (WaitLock): a child that ends now waits for this
			// transaction, and then finds the parent waiting; one that ended is seen here.
			kr, err := rs.e.st.RunLookup(ctx, t, c.Key.Scope, c.Key.ID)
			switch {
			case err != nil:
				return false, err
			case !kr.Found || kr.State == nil:
				return false, fmt.Errorf("the child run under key %q in scope %q is gone (its outcome expired and was reaped before the parent read it)", c.Key.ID, c.Key.Scope)
			case !kr.State.Finished():
				name := store.ChildWaitPrefix + c.Key.ID
				return true, rs.suspend(ctx, t, w, store.RunAwaiting, s.Seq, &name, nil)
			}
			if rec, err = json.Marshal(childOutcome{State: *kr.State, Output: rawJSON(kr.Output)}); err != nil {
				return false, err
			}
			_, err = rs.e.st.StepCheckpointInFenced(rs.checkpointParams(s, rec, nil)).Exec(ctx, t)
			return false, err
		})
		return rec, err
	})
	if err != nil {
		return zero, err
	}
	var got childOutcome
	if err := json.Unmarshal(out, &got); err != nil {
		return zero, StopRun(ctx, fmt.Errorf("workflow: stored outcome of child step %q cannot be decoded: %w", step, err))
	}
	data, _, ferr := storedOutcome(c.Workflow, c.Key, got.State, got.Output)
	if ferr != nil {
		return zero, ferr
	}
	var o Out
	if err := json.Unmarshal(data, &o); err != nil {
		return zero, StopRun(ctx, fmt.Errorf("workflow: output of child %q cannot be decoded into %T: %w", c.Workflow, o, err))
	}
	return o, nil
}

// parentEndedMessage is the stored reason of a child cancelled with its parent.
func parentEndedMessage(parent idem.Key, state store.RunState) string {
	return fmt.Sprintf("cancelled with its parent run (key %q in scope %q), which was %s", parent.ID, parent.Scope, state)
}

// endRun is what every transaction that ends a run other than by its owner's outcome does
// besides (a cancel, a timeout of a waiting run, a reconcile decision), once it has ended it: it
// wakes the run's parent, if it waits for it, starts a queued run of its concurrency key when it
// held a slot (it was not queued), and cancels its children when the run was cancelled or timed
// out. wakeParent is false for a caller that woke the parent already (first, to lock the parent
// before the run). It returns the children it cancelled.
func (e *Engine) endRun(ctx context.Context, t pgx.Tx, key idem.Key, state store.RunState, wakeParent, wasQueued bool) ([]store.RunKey, error) {
	if wakeParent {
		if err := e.wakeParent(ctx, t, key.Scope, key.ID); err != nil {
			return nil, err
		}
	}
	if err := e.admitEnded(ctx, t, key, wasQueued); err != nil {
		return nil, fmt.Errorf("error starting a queued run: %w", err)
	}
	if state != store.RunCancelled && state != store.RunTimedOut {
		return nil, nil
	}
	children, err := e.st.RunCancelChildren(ctx, t, key.Scope, key.ID, encodeFailure(parentEndedMessage(key, state)), e.cfg.TTL)
	if err != nil {
		return nil, fmt.Errorf("error cancelling the run's children: %w", err)
	}
	for _, c := range children {
		if err := e.admitEnded(ctx, t, idem.Key{Scope: c.Scope, ID: c.ID}, c.WasQueued); err != nil {
			return nil, fmt.Errorf("error starting a queued run: %w", err)
		}
	}
	return children, nil
}

// permanent marks a step's error as not worth retrying.
type permanent struct{ err error }

func (p *permanent) Error() string   { return p.err.Error() }
func (p *permanent) Unwrap() error   { return p.err }
func (p *permanent) Retryable() bool { return false }

// wakeParent is part of every transaction that ends a run (its outcome, a cancel, a timeout, a
// reconcile decision): when the run is a child whose parent waits for it, it inserts the job that
// wakes the parent. The parent's row is locked first (see store.RunParentLock), which orders
// this with a parent about to wait.
func (e *Engine) wakeParent(ctx context.Context, t pgx.Tx, scope, id string) error {
	p, ok, err := e.st.RunParentLock(ctx, t, scope, id)
	if err != nil || !ok || !p.Awaits {
		return err
	}
	jobs, err := e.jobs(ctx)
	if err != nil {
		return err
	}
	args := WakeArgs{Scope: p.Scope, ID: p.ID, Generation: p.Created, Seq: p.WaitSeq, Reason: "child", Suspended: p.Suspended}
	if err := jobs.insertTx(ctx, t, args, e.signalWakeOpts()); err != nil {
		return fmt.Errorf("error inserting the job that wakes the parent run: %w", err)
	}
	return nil
}
