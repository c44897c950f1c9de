package steps

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/workflow"
)

// Future is the outcome of a step that runs beside the workflow's code, in parallel with it and
// with other such steps ([GoTx], [GoCall]). Get waits for it; [Wait] waits for several, [Select]
// for the first of several.
//
//	a := steps.GoCall(ctx, "quote-a", quoteA, nil)
//	b := steps.GoCall(ctx, "quote-b", quoteB, nil)
//	qa, err := a.Get(ctx)
type Future[T any] struct {
	b *workflow.Branch
}

// Get waits for the step and returns its output, or its error (a *workflow.StepError when it
// failed for good).
//
//	quote, err := future.Get(ctx)
func (f *Future[T]) Get(ctx context.Context) (T, error) {
	var zero T
	data, err := f.b.Wait(ctx)
	if err != nil {
		return zero, err
	}
	return decode[T](ctx, f.b.Name(), data)
}

// Branch returns the workflow's branch behind the future, for Wait and Select.
//
//	_, err := workflow.SelectStep(ctx, "first", a.Branch(), b.Branch())
func (f *Future[T]) Branch() *workflow.Branch { return f.b }

// Awaitable is a future of any type: what Wait and Select take.
type Awaitable interface{ Branch() *workflow.Branch }

// GoTx is [Tx] run as a parallel branch: it starts fn in a transaction of its own, in a goroutine
// of its own, and returns at once. The step's writes commit exactly once, with its checkpoint, as
// soon as fn returns; the workflow goes on meanwhile and reads the output with Get. The step's
// position in the run is taken here, in the workflow's order, so that replays are deterministic
// whatever order branches finish in. At most workflow.Config.MaxParallelSteps branches of a run
// are in flight; GoTx waits for a slot beyond that.
//
//	reserves := make([]*steps.Future[Hold], len(items))
//	for i, it := range items {
//		reserves[i] = steps.GoTx(ctx, "reserve "+it.SKU, func(ctx context.Context, tx pgx.Tx) (Hold, error) {
//			return reserve(ctx, tx, it)
//		}, nil)
//	}
//	holds, err := steps.GetAll(ctx, reserves)
func GoTx[T any](ctx context.Context, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts *Opts) *Future[T] {
	if fn == nil {
		return failed[T](name, "GoTx")
	}
	return &Future[T]{b: workflow.GoStepTx(ctx, "tx", name, opts, func(ctx context.Context, t pgx.Tx, _ *workflow.StepInfo) ([]byte, error) {
		out, err := fn(ctx, t)
		if err != nil {
			return nil, err
		}
		return encode(name, out)
	})}
}

// GoCall is [Call] run as a parallel branch: fn runs in a goroutine of its own, with the step's
// derived key, and its checkpoint is written as soon as it returns.
//
//	a := steps.GoCall(ctx, "quote-a", func(ctx context.Context, key string) (Quote, error) {
//		return carrierA.Quote(ctx, key, parcel)
//	}, nil)
func GoCall[T any](ctx context.Context, name string, fn func(ctx context.Context, key string) (T, error), opts *Opts) *Future[T] {
	if fn == nil {
		return failed[T](name, "GoCall")
	}
	return &Future[T]{b: workflow.GoStep(ctx, "call", name, opts, func(ctx context.Context, info *workflow.StepInfo) ([]byte, error) {
		out, err := fn(ctx, info.Key)
		if err != nil {
			return nil, err
		}
		return encode(name, out)
	})}
}

func failed[T any](name, kind string) *Future[T] {
	return &Future[T]{b: workflow.FailedBranch(name, errors.New("steps: "+kind+" "+name+" needs a function; fn is nil"))}
}

// Wait waits for every future and returns the error of the first one (in argument order) that
// failed, nil when all succeeded. Each future's output is read with its Get.
//
//	if err := steps.Wait(ctx, a, b, c); err != nil {
//		return Receipt{}, err
//	}
func Wait(ctx context.Context, futures ...Awaitable) error {
	var first error
	for _, f := range futures {
		if _, err := f.Branch().Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// GetAll waits for every future and returns their outputs in order, or the error of the first
// one (in order) that failed.
//
//	holds, err := steps.GetAll(ctx, reserves)
func GetAll[T any](ctx context.Context, futures []*Future[T]) ([]T, error) {
	outs := make([]T, len(futures))
	var first error
	for i, f := range futures {
		out, err := f.Get(ctx)
		if err != nil && first == nil {
			first = err
		}
		outs[i] = out
	}
	if first != nil {
		return nil, first
	}
	return outs, nil
}

// Select waits for the first of the futures to complete (with its output or its error) and
// returns its index, in a step named name whose checkpoint is the choice: a replay picks the
// same future even when all have completed by then.
//
//	switch i, err := steps.Select(ctx, "first quote", a, b); {
//	case err != nil:
//		return err
//	case i == 0:
//		quote, err = a.Get(ctx)
//	default:
//		quote, err = b.Get(ctx)
//	}
func Select(ctx context.Context, name string, futures ...Awaitable) (int, error) {
	branches := make([]*workflow.Branch, len(futures))
	for i, f := range futures {
		branches[i] = f.Branch()
	}
	return workflow.SelectStep(ctx, name, branches...)
}
