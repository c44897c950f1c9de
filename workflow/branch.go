package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/tx"
)

// Parallel branches. A branch is a step that runs beside the workflow's code, in a goroutine of
// its own: the workflow goes on and waits for it later (Branch.Wait, SelectStep). Its position
// in the run is taken when the workflow starts it, in the workflow's own order, so a replay
// assigns the same positions and replays a completed branch from the history, whatever order
// the branches completed in. A branch writes on its own: a Tx branch runs in a transaction of
// its own and commits its checkpoint with it at once (not held open as the workflow's own Tx
// steps are), and a Call branch writes its checkpoint as soon as it returns. At most
// Config.MaxParallelSteps branches of a run are in flight; starting one more waits for a slot.
// The workflow's line waits for its branches before it suspends (a sleep, an await) and before
// the run ends.

// DefaultMaxParallelSteps bounds the parallel branches of a run in flight, unless
// Config.MaxParallelSteps says otherwise.
//
//	cfg := &workflow.Config{MaxParallelSteps: 2 * workflow.DefaultMaxParallelSteps}
const DefaultMaxParallelSteps = 8

// Branch is a step started by [GoStep] or [GoStepTx] that runs beside the workflow's code. Wait
// for its outcome with Wait, or for the first of several with [SelectStep]. Package steps wraps
// it in a typed future (steps.GoTx, steps.GoCall).
//
//	b := workflow.GoStep(ctx, "call", "quote-a", nil, quoteA)
//	out, err := b.Wait(ctx)
type Branch struct {
	name string
	seq  int
	done chan struct{}
	out  []byte
	err  error
}

// Name is the branch's step name.
//
//	fmt.Println(b.Name())
func (b *Branch) Name() string { return b.name }

// Done is closed when the branch has its outcome.
//
//	select {
//	case <-b.Done():
//	case <-ctx.Done():
//	}
func (b *Branch) Done() <-chan struct{} { return b.done }

// Wait waits for the branch and returns its output (JSON), or its error: the step's
// *StepError when it failed for good, or why the run stopped. It returns early, with the
// context's cause, when ctx ends (the run stopped).
//
//	out, err := b.Wait(ctx)
func (b *Branch) Wait(ctx context.Context) ([]byte, error) {
	select {
	case <-b.done:
		return b.out, b.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (b *Branch) finish(out []byte, err error) {
	b.out, b.err = out, err
	close(b.done)
}

// branchKey marks the context a branch's function receives with the branch's name: a step or
// patch called with it would take its position whenever the branch got there, in a race with the
// workflow's line, and is refused (see inBranch).
type branchKey struct{}

// inBranch refuses a step or patch called with the context of a branch's function.
func (rs *runState) inBranch(ctx context.Context, what string) error {
	branch, ok := ctx.Value(branchKey{}).(string)
	if !ok {
		return nil
	}
	return rs.stop(&machineryError{fmt.Errorf("workflow: %s was called inside the function of step %q, a parallel branch; call steps from the workflow's function (which may start more branches), so that their order is the same on every resume", what, branch)})
}

// branches are a run's parallel branches in flight.
type branches struct {
	once     sync.Once
	slots    chan struct{} // a token per branch in flight, MaxParallelSteps deep
	inflight sync.WaitGroup
}

// drain waits for the branches in flight: the workflow's line does so before it suspends and
// before the run ends, so that no branch is still writing then.
func (rs *runState) drain() { rs.branches.inflight.Wait() }

// GoStep starts a step of kind whose work happens outside Postgres (steps.GoCall is built on it)
// as a parallel branch, and returns at once: body runs in a goroutine of its own, with retries
// as opts say, and its output is checkpointed as soon as it returns. If the history holds the
// step, the branch is complete already, with the stored outcome. Errors come back from
// Branch.Wait. Package steps is the intended caller.
//
//	b := workflow.GoStep(ctx, "call", "quote-a", nil, func(ctx context.Context, info *workflow.StepInfo) ([]byte, error) {
//		return json.Marshal(quote(ctx, info.Key))
//	})
func GoStep(ctx context.Context, kind, name string, opts *StepOpts, body func(ctx context.Context, info *StepInfo) ([]byte, error)) *Branch {
	return goStep(ctx, kind, name, opts, false, func(ctx context.Context, s *StepInfo) ([]byte, error) {
		out, err := s.rs.e.callBody(name, body)(ctx, s)
		if err != nil {
			return nil, err
		}
		if err := s.rs.checkStepOutput(s, out); err != nil {
			return nil, err
		}
		if err := s.rs.writeCheckpoint(ctx, s.rs.checkpointParams(s, out, nil)); err != nil {
			return nil, err
		}
		return out, nil
	})
}

// GoStepTx starts a step of kind whose work is a Postgres transaction (steps.GoTx is built on
// it) as a parallel branch: body runs in a transaction of its own, in a goroutine of its own, and
// the step's checkpoint commits with it, fenced by the run's lease, so its writes commit exactly
// once. Serialization failures and deadlocks rerun the transaction; other errors are retried as
// opts say. Package steps is the intended caller.
//
//	b := workflow.GoStepTx(ctx, "tx", "reserve-a", nil, func(ctx context.Context, t pgx.Tx, info *workflow.StepInfo) ([]byte, error) {
//		_, err := t.Exec(ctx, "UPDATE stock SET held = held + 1 WHERE sku = 'a'")
//		return []byte("null"), err
//	})
func GoStepTx(ctx context.Context, kind, name string, opts *StepOpts, body func(ctx context.Context, t pgx.Tx, info *StepInfo) ([]byte, error)) *Branch {
	return goStep(ctx, kind, name, opts, true, func(ctx context.Context, s *StepInfo) ([]byte, error) {
		return s.rs.branchTxRetrying(ctx, s, body)
	})
}

func goStep(ctx context.Context, kind, name string, opts *StepOpts, inPostgres bool, attempt func(ctx context.Context, s *StepInfo) ([]byte, error)) *Branch {
	b := &Branch{name: name, done: make(chan struct{})}
	c, err := claimStep(ctx, kind, name, opts, false)
	if err != nil || c.replayed {
		b.finish(c.output, err)
		return b
	}
	rs := c.rs
	b.seq = c.info.Seq
	// A branch writes in a transaction of its own, whose fence must see the run: what the run's
	// transaction holds (its start, a Tx step) commits first.
	if err := rs.boundary(ctx, false); err != nil {
		b.finish(nil, err)
		return b
	}
	rs.branches.once.Do(func() { rs.branches.slots = make(chan struct{}, rs.e.cfg.MaxParallelSteps) })
	select {
	case rs.branches.slots <- struct{}{}:
	case <-ctx.Done():
		b.finish(nil, rs.stop(context.Cause(ctx)))
		return b
	}
	rs.branches.inflight.Add(1)
	go func() {
		defer rs.branches.inflight.Done()
		defer func() { <-rs.branches.slots }()
		sctx, span := rs.e.startStep(ctx, rs.rkey(), rs.def.Name(), kind, name, c.info.Seq, false)
		sctx = context.WithValue(sctx, branchKey{}, name)
		out, err := rs.attempts(sctx, c.info, &c.cfg, inPostgres, span, attempt)
		span.end(c.info.Attempt, err)
		b.finish(out, err)
	}()
	return b
}

// branchTx runs one attempt of a Tx branch in a transaction of its own, and commits it with the
// step's checkpoint.
func (rs *runState) branchTx(ctx context.Context, s *StepInfo, body func(ctx context.Context, t pgx.Tx, info *StepInfo) ([]byte, error)) ([]byte, error) {
	bt := &runTx{rs: rs}
	if err := bt.begin(ctx); err != nil {
		return nil, err
	}
	out, err := body(ctx, bt.view, s)
	if err == nil {
		err = rs.checkStepOutput(s, out)
	}
	if err != nil {
		bt.rollback(ctx)
		return nil, err
	}
	bt.hold(rs.checkpointParams(s, out, nil))
	if err := bt.commit(ctx); err != nil {
		if stopped := rs.stopped(); stopped != nil {
			return nil, stopped // the checkpoint's fence: the lease is gone
		}
		if errors.Is(err, tx.ErrCommitUnknown) {
			// It may have landed: the run stops, and a resume reads the history to see.
			return nil, rs.stop(&machineryError{fmt.Errorf("workflow: the commit of branch %q was lost: %w", s.Name, err)})
		}
		return nil, err
	}
	return out, nil
}

// branchTxRetrying runs a Tx branch's attempt again on a serialization failure or deadlock, as
// tx.Run would.
func (rs *runState) branchTxRetrying(ctx context.Context, s *StepInfo, body func(ctx context.Context, t pgx.Tx, info *StepInfo) ([]byte, error)) ([]byte, error) {
	return rs.rerunOnConflict(ctx, func() ([]byte, error) { return rs.branchTx(ctx, s, body) })
}

// SelectStep waits for the first of branches to complete, in a step named name, and returns its
// index. The choice is the step's checkpoint, so a replay returns the same index even when every
// branch has completed by then. Package steps is the intended caller (steps.Select).
//
//	i, err := workflow.SelectStep(ctx, "fastest", a, b)
func SelectStep(ctx context.Context, name string, branches ...*Branch) (int, error) {
	if len(branches) == 0 {
		return 0, errors.New("workflow: select needs at least one branch")
	}
	out, err := RunStep(ctx, "select", name, &StepOpts{MaxAttempts: 1}, func(ctx context.Context, _ *StepInfo) ([]byte, error) {
		cases := make(chan int, len(branches))
		for i, b := range branches {
			go func() {
				select {
				case <-b.done:
					cases <- i
				case <-ctx.Done():
				}
			}()
		}
		select {
		case i := <-cases:
			return json.Marshal(i)
		case <-ctx.Done():
			return nil, StopRun(ctx, context.Cause(ctx))
		}
	})
	if err != nil {
		return 0, err
	}
	var i int
	if err := json.Unmarshal(out, &i); err != nil || i < 0 || i >= len(branches) {
		return 0, StopRun(ctx, fmt.Errorf("workflow: stored choice of select %q (%s) does not fit its %d branches", name, out, len(branches)))
	}
	return i, nil
}

// FailedBranch is a branch that failed before it started, with err: for a step kind whose
// arguments are wrong.
//
//	b := workflow.FailedBranch("quote", errors.New("steps: GoCall quote needs a function; fn is nil"))
func FailedBranch(name string, err error) *Branch {
	b := &Branch{name: name, done: make(chan struct{})}
	b.finish(nil, err)
	return b
}
