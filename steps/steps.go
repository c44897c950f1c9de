// Package steps holds the kinds of step a workflow calls (see package workflow). Each step has
// a name, unique in its position: the names are the run's recovery points. A completed step
// never runs again; a resumed run gets its stored output back.
//
//   - [Tx] runs a function in a Postgres transaction, and commits the step's checkpoint in the
//     same transaction: its writes happen exactly once.
//   - [Call] runs a function with effects outside Postgres (a payment provider, mail) and hands
//     it a key derived from the run and the step, the same on every attempt and resume: it runs
//     at least once, and an outside service that honours idempotency keys applies it once.
//   - [Enqueue] inserts a River job in the step's transaction: the job exists exactly once.
//   - [Sleep] and [SleepUntil] wait, durably, and [Await] waits for a signal sent with
//     workflow.Engine.SignalTx; while it waits the run holds no lease, goroutine, connection or
//     River worker, and a River job wakes it.
//   - [SetEvent] publishes a value that workflow.Engine.EventGet reads without running anything.
//
// Outputs are stored as JSON, and a step returns its output as decoded from what was stored, so
// the first run and every replay see the same value.
//
//	var Payout = workflow.Define("payout", func(ctx context.Context, req PayoutReq) (Receipt, error) {
//		hold, err := steps.Tx(ctx, "reserve", func(ctx context.Context, tx pgx.Tx) (Hold, error) {
//			return reserve(ctx, tx, req)
//		}, nil)
//		if err != nil {
//			return Receipt{}, err
//		}
//		charge, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (Charge, error) {
//			return psp.Charge(ctx, key, hold.Amount)
//		}, &steps.Opts{MaxAttempts: 5})
//		if err != nil {
//			return Receipt{}, err
//		}
//		if err := steps.Enqueue(ctx, "notify", NotifyArgs{Payout: req.ID}, nil, nil); err != nil {
//			return Receipt{}, err
//		}
//		return steps.Tx(ctx, "settle", func(ctx context.Context, tx pgx.Tx) (Receipt, error) {
//			return settle(ctx, tx, hold, charge)
//		}, nil)
//	})
package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemkit/idem/workflow"
)

// Opts configure a step's retries. nil means the defaults (3 attempts, backoff from 100ms to
// 10s with full jitter, no per-attempt timeout). See workflow.StepOpts for each field.
//
//	steps.Call(ctx, "charge", charge, &steps.Opts{MaxAttempts: 10, Timeout: 30 * time.Second})
type Opts = workflow.StepOpts

// Tx runs fn in a transaction and commits its writes together with the step's checkpoint, which
// is fenced by the run's lease: the writes commit exactly once, and never from a process that
// lost the run. fn may run more than once before that (Postgres serialization failures and
// deadlocks rerun it, as tx.Run does; other errors are retried as opts say), each time in a new
// transaction, so it must not have effects outside the transaction.
//
//	hold, err := steps.Tx(ctx, "reserve", func(ctx context.Context, tx pgx.Tx) (Hold, error) {
//		var h Hold
//		err := tx.QueryRow(ctx, `UPDATE accounts SET held = held + $2 WHERE id = $1 RETURNING id, $2`,
//			req.Account, req.Amount).Scan(&h.Account, &h.Amount)
//		return h, err
//	}, nil)
//
// An error that fn returns on its last attempt is stored as the step's outcome and returned as a
// *workflow.StepError, now and on every resume. Wrap an error with [Permanent] to fail without
// more attempts.
func Tx[T any](ctx context.Context, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts *Opts) (T, error) {
	var zero T
	if fn == nil {
		return zero, fmt.Errorf("steps: Tx %q needs a function; fn is nil", name)
	}
	data, err := workflow.RunStepTx(ctx, "tx", name, opts, func(ctx context.Context, t pgx.Tx, _ *workflow.StepInfo) ([]byte, error) {
		out, err := fn(ctx, t)
		if err != nil {
			return nil, err
		}
		return encode(name, out)
	})
	if err != nil {
		return zero, err
	}
	return decode[T](ctx, name, data)
}

// Call runs fn, whose effect is outside Postgres, and checkpoints its output. fn receives the
// step's derived key (see workflow.StepKey): the same on every attempt, every resume and in
// every process, different for every step and run. Hand it to the outside service as its
// idempotency key, and a call repeated after a crash is applied there once.
//
//	charge, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (Charge, error) {
//		return psp.Charge(ctx, psp.ChargeParams{Amount: hold.Amount, IdempotencyKey: key})
//	}, nil)
//
// Call is at least once: a process that dies after fn's effect but before the checkpoint
// commits leaves the step to run again on resume, with the same key. Failures are retried and
// stored as for [Tx].
func Call[T any](ctx context.Context, name string, fn func(ctx context.Context, key string) (T, error), opts *Opts) (T, error) {
	var zero T
	if fn == nil {
		return zero, fmt.Errorf("steps: Call %q needs a function; fn is nil", name)
	}
	data, err := workflow.RunStep(ctx, "call", name, opts, func(ctx context.Context, info *workflow.StepInfo) ([]byte, error) {
		out, err := fn(ctx, info.Key)
		if err != nil {
			return nil, err
		}
		return encode(name, out)
	})
	if err != nil {
		return zero, err
	}
	return decode[T](ctx, name, data)
}

// Enqueue inserts a River job with the application's River client (see
// workflow.Engine.SetClient) in the step's transaction, the transactional outbox: the job is
// inserted exactly once, however often the run is resumed. insertOpts are River's, opts the
// step's retries (as for [Tx]); nil for the defaults.
//
//	err := steps.Enqueue(ctx, "notify", NotifyArgs{Payout: req.ID}, &river.InsertOpts{Queue: "mail"}, &steps.Opts{MaxAttempts: 10})
//
// The job runs as River runs jobs (at least once, with River's retries); give it its own
// idempotency, for instance an idem.Do keyed by the job's arguments, if running twice matters.
func Enqueue(ctx context.Context, name string, args river.JobArgs, insertOpts *river.InsertOpts, opts *Opts) error {
	if args == nil {
		return fmt.Errorf("steps: Enqueue %q needs job args; args is nil", name)
	}
	_, err := workflow.RunStepTx(ctx, "enqueue", name, opts, func(ctx context.Context, t pgx.Tx, info *workflow.StepInfo) ([]byte, error) {
		client, err := info.RiverClient(ctx)
		if err != nil {
			// A setup mistake, not the step's failure: the run waits for a fixed deploy.
			return nil, workflow.StopRun(ctx, err)
		}
		res, err := client.InsertTx(ctx, t, args, insertOpts)
		if err != nil {
			return nil, fmt.Errorf("error inserting %s job: %w", args.Kind(), err)
		}
		return encode(name, res.Job.ID)
	})
	return err
}

// Permanent marks err as not worth retrying: the step fails at once, with its error stored,
// instead of running again until it is out of attempts. A declined card is permanent; a timeout
// is not.
//
//	if resp.StatusCode == http.StatusPaymentRequired {
//		return Charge{}, steps.Permanent(errors.New("card declined"))
//	}
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() error   { return e.err }
func (e *permanentError) Retryable() bool { return false }

// IsPermanent reports whether err was marked with [Permanent].
//
//	if steps.IsPermanent(err) { ... }
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

func encode(name string, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, Permanent(fmt.Errorf("steps: error encoding output of step %q (type %T) as JSON: %w", name, v, err))
	}
	return data, nil
}

// decode reads a step's stored output. One that no longer fits T means a deploy changed the
// step's type under a run in progress: that stops the run (it is resumed once the code fits
// again), rather than failing it for good.
func decode[T any](ctx context.Context, name string, data []byte) (T, error) {
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return v, workflow.StopRun(ctx, fmt.Errorf("steps: stored output of step %q cannot be decoded into %T (did the step's type change?): %w", name, v, err))
	}
	return v, nil
}

// Child runs wf as a child of the run under ctx and returns its output: its start is the step
// name, and the wait for its outcome a second step of that name, during which this run holds
// nothing. See workflow.Workflow.RunChild.
//
//	label, err := steps.Child(ctx, "ship", Ship, order, nil)
func Child[In, Out any](ctx context.Context, name string, wf *workflow.Workflow[In, Out], in In, opts *workflow.ChildOpts) (Out, error) {
	return wf.RunChild(ctx, name, in, opts)
}

// StartChild starts wf as a child of the run under ctx in the step name, and returns it without
// waiting; wait for its outcome later with its Wait method. See workflow.Workflow.StartChild.
//
//	child, err := steps.StartChild(ctx, "ship", Ship, order, nil)
//	...
//	label, err := child.Wait(ctx, "ship-done")
func StartChild[In, Out any](ctx context.Context, name string, wf *workflow.Workflow[In, Out], in In, opts *workflow.ChildOpts) (*workflow.ChildRun[Out], error) {
	return wf.StartChild(ctx, name, in, opts)
}
