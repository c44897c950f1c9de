package workflowtest_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
	"github.com/idemkit/idem/workflow/workflowtest"
)

const day = 24 * time.Hour

// The workflow of the long waits: a charge, a 30-day cool-off, then a week to confirm, or the
// charge is released.
type outcome struct {
	Charge    string `json:"charge"`
	Confirmed bool   `json:"confirmed"`
	Released  string `json:"released,omitempty"`
}

var longWaits = workflow.Define("long-waits", func(ctx context.Context, amount int) (outcome, error) {
	charge, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (string, error) {
		return "", errors.New("the real payment provider is not called in tests")
	}, nil)
	if err != nil {
		return outcome{}, err
	}
	if err := steps.Sleep(ctx, "cool-off", 30*day); err != nil {
		return outcome{}, err
	}
	_, err = steps.Await[string](ctx, "confirm", "confirmed", 7*day)
	switch {
	case errors.Is(err, workflow.ErrAwaitTimeout):
		released, err := steps.Call(ctx, "release", func(ctx context.Context, key string) (string, error) {
			return "", errors.New("the real payment provider is not called in tests")
		}, nil)
		return outcome{Charge: charge, Released: released}, err
	case err != nil:
		return outcome{}, err
	}
	return outcome{Charge: charge, Confirmed: true}, nil
})

type testBundle struct {
	ctx     context.Context
	te      *workflowtest.Engine
	charges atomic.Int32
}

func setup(t testing.TB) *testBundle {
	b := &testBundle{ctx: context.Background()}
	b.te = workflowtest.New(t, &workflowtest.Config{
		Workflows: []workflow.Definition{longWaits},
		Fakes: map[string]workflowtest.Fake{
			"charge": func(ctx context.Context, key string) (any, error) {
				b.charges.Add(1)
				return "ch_" + key[:8], nil
			},
			"release": func(ctx context.Context, key string) (any, error) { return "re_" + key[:8], nil },
		},
	})
	return b
}

func kinds(steps []workflow.StepRow) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.Kind + ":" + s.Name
	}
	return out
}

func TestEngine(t *testing.T) {
	t.Parallel()

	// The sleep, the await's timeout and the deadline fire when the clock reaches them, and not
	// before; the fakes stand in for the calls.
	t.Run("LongWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e := b.te.Engine()
		key := idem.Key{Scope: "s", ID: "k"}
		start := b.te.Now()
		_, err := longWaits.Run(b.ctx, e, key, 10, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateSleeping, run.State)
		require.Equal(t, start.Add(30*day), *run.WakeAt, "the wake-up is in virtual time")

		require.NoError(t, b.te.Advance(b.ctx, 29*day))
		run, err = e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateSleeping, run.State, "not before its time")

		require.NoError(t, b.te.Advance(b.ctx, day))
		run, err = e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateAwaiting, run.State)
		require.Equal(t, start.Add(37*day), *run.WakeAt)

		require.NoError(t, b.te.Advance(b.ctx, 7*day))
		out, err := longWaits.Get(b.ctx, e, key)
		require.NoError(t, err)
		require.False(t, out.Confirmed)
		require.Equal(t, "ch_"+workflow.StepKey(key, run.Created, 1, "charge")[:8], out.Charge, "the fake got the step's derived key")
		require.NotEmpty(t, out.Released)
		history, err := b.te.History(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, []string{"call:charge", "sleep:cool-off", "await:confirm", "call:release"}, kinds(history))
		require.JSONEq(t, `{"timed_out": true}`, string(history[2].Output))
		require.EqualValues(t, 1, b.charges.Load())
		require.Equal(t, start.Add(37*day), b.te.Now())
	})

	t.Run("SignalFromTheTest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := idem.Key{Scope: "s", ID: "k"}
		_, err := longWaits.Run(b.ctx, b.te.Engine(), key, 10, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.NoError(t, b.te.Advance(b.ctx, 31*day)) // through the sleep, into the await
		res, err := b.te.Signal(b.ctx, key, "confirmed", "yes", nil)
		require.NoError(t, err)
		require.False(t, res.Duplicate)
		out, err := longWaits.Get(b.ctx, b.te.Engine(), key)
		require.NoError(t, err, "the signal woke the run, within Signal")
		require.True(t, out.Confirmed)
	})

	// A deadline in the middle of a sleep times the run out there.
	t.Run("Deadline", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := idem.Key{Scope: "s", ID: "k"}
		start := b.te.Now()
		_, err := longWaits.Run(b.ctx, b.te.Engine(), key, 10, &workflow.RunOpts{Timeout: 10 * day})
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.NoError(t, b.te.Advance(b.ctx, 9*day))
		_, err = longWaits.Get(b.ctx, b.te.Engine(), key)
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.NoError(t, b.te.Advance(b.ctx, 12*time.Hour+day))
		_, err = longWaits.Get(b.ctx, b.te.Engine(), key)
		require.ErrorIs(t, err, workflow.ErrDeadlineExceeded)
		run, err := b.te.Engine().RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, start.Add(10*day), *run.Finished, "at its deadline, not where the clock stopped")
		require.NoError(t, b.te.Advance(b.ctx, day))
		_, err = longWaits.Get(b.ctx, b.te.Engine(), key)
		require.ErrorIs(t, err, idem.ErrNotFound, "a finished run expires after Config.TTL (a day) of virtual time")
	})

	t.Run("ClockOnlyMovesForward", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.ErrorIs(t, b.te.Advance(b.ctx, -time.Second), workflowtest.ErrClockBackwards)
		err := b.te.AdvanceTo(b.ctx, b.te.Now().Add(-time.Hour))
		require.ErrorIs(t, err, workflowtest.ErrClockBackwards)
		require.ErrorContains(t, err, "before the clock's time")
		require.NoError(t, b.te.AdvanceTo(b.ctx, b.te.Now().Add(time.Hour)))
	})

	// Failed attempts of a fake are retried at once, and a permanent error fails the step; the
	// rest of the engine (StartTx, RunResume) works without River.
	t.Run("RetriesStartTxAndResume", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		var fixed atomic.Bool
		wf := workflow.Define("flaky", func(ctx context.Context, _ int) (string, error) {
			return steps.Call(ctx, "flaky", func(context.Context, string) (string, error) { return "real", nil }, &steps.Opts{MinBackoff: time.Hour})
		})
		te := workflowtest.New(t, &workflowtest.Config{
			Workflows: []workflow.Definition{wf},
			Fakes: map[string]workflowtest.Fake{"flaky": func(ctx context.Context, key string) (any, error) {
				switch n := calls.Add(1); {
				case fixed.Load():
					return "fake", nil
				case n < 3:
					return nil, errors.New("try again")
				default:
					return nil, steps.Permanent(errors.New("declined"))
				}
			}},
		})
		ctx, key := context.Background(), idem.Key{Scope: "s", ID: "k"}
		began := time.Now()
		_, err := wf.Run(ctx, te.Engine(), key, 1, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		require.Less(t, time.Since(began), time.Hour, "the hour of backoff was not waited out")
		require.EqualValues(t, 3, calls.Load())
		run, err := te.Engine().RunGet(ctx, key)
		require.NoError(t, err)
		require.Len(t, run.Failures, 3)

		fixed.Store(true)
		require.NoError(t, te.Engine().RunResume(ctx, key))
		require.NoError(t, te.RunDue(ctx))
		out, err := wf.Get(ctx, te.Engine(), key)
		require.NoError(t, err)
		require.Equal(t, "fake", out)

		started := idem.Key{Scope: "s", ID: "started"}
		require.NoError(t, pgx.BeginFunc(ctx, te.DB(), func(t pgx.Tx) error { return wf.StartTx(ctx, te.Engine(), t, started, 2) }))
		_, err = wf.Get(ctx, te.Engine(), started)
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.NoError(t, te.RunDue(ctx))
		out, err = wf.Get(ctx, te.Engine(), started)
		require.NoError(t, err)
		require.Equal(t, "fake", out)
	})

	// A second engine on the same database, with new code, is a deploy: it shares the clock and
	// wakes the first one's runs.
	t.Run("ADeployIsAnotherEngineOnTheDatabase", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := idem.Key{Scope: "s", ID: "k"}
		_, err := longWaits.Run(b.ctx, b.te.Engine(), key, 10, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.NoError(t, b.te.Advance(b.ctx, 5*day))

		v2 := workflow.Define("long-waits", func(ctx context.Context, amount int) (outcome, error) {
			ok, err := workflow.Patched(ctx, "no-release")
			return outcome{Confirmed: ok}, err
		})
		te2 := workflowtest.New(t, &workflowtest.Config{Workflows: []workflow.Definition{v2}, DB: b.te.DB()})
		require.Equal(t, b.te.Now(), te2.Now(), "the clock is the database's")
		require.NoError(t, te2.Advance(b.ctx, 25*day))
		_, err = v2.Get(b.ctx, te2.Engine(), key)
		require.ErrorIs(t, err, workflow.ErrNonDeterminism, "v2 returned where the history goes on")
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		ft := &fatalTB{TB: t}
		func() {
			defer func() { _ = recover() }()
			workflowtest.New(ft, &workflowtest.Config{Fakes: map[string]workflowtest.Fake{"x": nil}})
		}()
		require.Contains(t, ft.msg, `the fake of step "x" in Config.Fakes is nil`)
	})
}

// fatalTB records a Fatalf instead of failing the test, and stops the goroutine as Fatalf does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f.msg)
}

// TestEngineChildrenAndBranches: children, parallel branches and their fakes run on the test
// engine as on River: a parent waiting for its child, which sleeps a week, is woken by the
// child's end within the Advance that ends it.
func TestEngineChildrenAndBranches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	child := workflow.Define("child", func(ctx context.Context, n int) (int, error) {
		if err := steps.Sleep(ctx, "week", 7*day); err != nil {
			return 0, err
		}
		return steps.Call(ctx, "double", func(context.Context, string) (int, error) { return 0, errors.New("faked") }, nil)
	})
	parent := workflow.Define("parent", func(ctx context.Context, n int) (int, error) {
		a := steps.GoCall(ctx, "quote-a", func(context.Context, string) (int, error) { return 0, errors.New("faked") }, nil)
		b := steps.GoCall(ctx, "quote-b", func(context.Context, string) (int, error) { return 0, errors.New("faked") }, nil)
		quotes, err := steps.GetAll(ctx, []*steps.Future[int]{a, b})
		if err != nil {
			return 0, err
		}
		doubled, err := steps.Child(ctx, "child", child, n, nil)
		return quotes[0] + quotes[1] + doubled, err
	})
	te := workflowtest.New(t, &workflowtest.Config{
		Workflows: []workflow.Definition{parent, child},
		Fakes: map[string]workflowtest.Fake{
			"quote-a": func(context.Context, string) (any, error) { return 1, nil },
			"quote-b": func(context.Context, string) (any, error) { return 10, nil },
			"double":  func(context.Context, string) (any, error) { return 100, nil },
		},
	})
	key := idem.Key{Scope: "s", ID: "parent"}
	_, err := parent.Run(ctx, te.Engine(), key, 1, nil)
	require.ErrorIs(t, err, idem.ErrInFlight, "waiting for its child")
	require.NoError(t, te.RunDue(ctx)) // the child starts, and sleeps
	_, err = parent.Get(ctx, te.Engine(), key)
	require.ErrorIs(t, err, idem.ErrInFlight)
	require.NoError(t, te.Advance(ctx, 7*day))
	out, err := parent.Get(ctx, te.Engine(), key)
	require.NoError(t, err)
	require.Equal(t, 111, out)
}
