package workflow_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// TestLimits: a run's input, a step's output, a signal's payload and a run's pending signals are
// bounded by Config; over a limit the error names the limit and its Config field, and nothing of
// what was over it is stored.
func TestLimits(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 200)

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := workflow.Define("echo", func(ctx context.Context, in string) (string, error) { return in, nil })
		e := b.engine(t, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quietLogger()})
		_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "k"}, strings.Repeat("x", workflow.DefaultMaxInputBytes), nil)
		require.ErrorIs(t, err, workflow.ErrLimitExceeded, "1 MiB of characters is over 1 MiB of JSON, with its quotes")
		require.ErrorContains(t, err, "Config.MaxInputBytes")
		_, err = wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "k"}, strings.Repeat("x", workflow.DefaultMaxInputBytes-2), nil)
		require.NoError(t, err, "exactly the limit")

		for _, field := range []string{"MaxInputBytes", "MaxStepOutputBytes", "MaxSignalPayloadBytes", "MaxPendingSignals"} {
			cfg := &workflow.Config{}
			switch field {
			case "MaxInputBytes":
				cfg.MaxInputBytes = -1
			case "MaxStepOutputBytes":
				cfg.MaxStepOutputBytes = -1
			case "MaxSignalPayloadBytes":
				cfg.MaxSignalPayloadBytes = -1
			case "MaxPendingSignals":
				cfg.MaxPendingSignals = -1
			}
			_, err := workflow.NewEngine(b.pool, cfg)
			require.ErrorContains(t, err, field+" cannot be negative")
		}
	})

	t.Run("Input", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ran := false
		wf := workflow.Define("echo", func(ctx context.Context, in string) (string, error) { ran = true; return in, nil })
		cfg := fastConfig(wf)
		cfg.MaxInputBytes = 100
		e := b.engine(t, cfg)
		e.SetClient(insertOnlyClient(t, b))
		_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "k"}, big, nil)
		var over *workflow.LimitError
		require.ErrorAs(t, err, &over)
		require.Equal(t, workflow.LimitError{Field: "MaxInputBytes", What: `the input of a run of "echo"`, Size: 202, Max: 100}, *over)
		require.EqualError(t, err, `workflow: the input of a run of "echo" is 202 bytes, more than the limit of 100 (Config.MaxInputBytes); nothing of it was stored`)
		require.False(t, ran)
		err = pgx.BeginFunc(b.ctx, b.pool, func(t pgx.Tx) error { return wf.StartTx(b.ctx, e, t, idem.Key{Scope: "s", ID: "k2"}, big) })
		require.ErrorIs(t, err, workflow.ErrLimitExceeded)
		err = wf.Schedule(b.ctx, e, "hourly", big, &workflow.ScheduleOpts{Every: time.Hour})
		require.ErrorIs(t, err, workflow.ErrLimitExceeded, "every tick's run would get the input")
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_schedules`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM river_job`))
	})

	// A step whose output is over the limit fails for good at once: the output would be as big
	// on every retry. A Tx step's writes roll back with it.
	t.Run("StepOutput", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var calls int
		wf := workflow.Define("big", func(ctx context.Context, kind string) (string, error) {
			switch kind {
			case "tx":
				return steps.Tx(ctx, "write", func(ctx context.Context, tx pgx.Tx) (string, error) {
					_, err := tx.Exec(ctx, `INSERT INTO effects (run, step) VALUES ('big', 'write')`)
					return big, err
				}, &steps.Opts{MaxAttempts: 5})
			case "call":
				return steps.Call(ctx, "fetch", func(context.Context, string) (string, error) { calls++; return big, nil }, &steps.Opts{MaxAttempts: 5})
			default:
				return "", steps.SetEvent(ctx, "status", big)
			}
		})
		cfg := fastConfig(wf)
		cfg.MaxStepOutputBytes = 100
		e := b.engine(t, cfg)
		for _, kind := range []string{"tx", "call", "event"} {
			_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: kind}, kind, nil)
			require.ErrorIs(t, err, workflow.ErrFailed, kind)
			require.ErrorContains(t, err, "is 202 bytes, more than the limit of 100 (Config.MaxStepOutputBytes)", kind)
			run, err := e.RunGet(b.ctx, idem.Key{Scope: "s", ID: kind})
			require.NoError(t, err)
			require.Len(t, run.Steps, 1, kind)
			require.Equal(t, 1, run.Steps[0].Attempts, "%s: not retried", kind)
			require.Nil(t, run.Steps[0].Output, "%s: the output is not stored", kind)
			require.Contains(t, run.Steps[0].Error, "Config.MaxStepOutputBytes")
			require.Equal(t, workflow.AttemptPermanent, run.Failures[0].Outcome)
		}
		require.Zero(t, b.effects(t, "write"), "the Tx step's write rolled back")
		require.Equal(t, 1, calls, "the Call ran once")
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_events`), "the event was not published")
	})

	t.Run("Signals", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := workflow.Define("waits", func(ctx context.Context, _ int) (string, error) {
			return steps.Await[string](ctx, "wait", "go", 0)
		})
		cfg := fastConfig(wf)
		cfg.MaxSignalPayloadBytes, cfg.MaxPendingSignals = 100, 3
		e := b.engine(t, cfg)
		e.SetClient(insertOnlyClient(t, b))
		key := idem.Key{Scope: "s", ID: "k"}
		_, err := wf.Run(b.ctx, e, key, 1, nil)
		require.ErrorIs(t, err, idem.ErrInFlight, "the run awaits")
		signal := func(payload any, dedupe string) (*workflow.SignalResult, error) {
			var res *workflow.SignalResult
			err := pgx.BeginFunc(b.ctx, b.pool, func(t pgx.Tx) error {
				var err error
				res, err = e.SignalTx(b.ctx, t, key, "other", payload, &workflow.SignalOpts{DedupeID: dedupe})
				return err
			})
			return res, err
		}
		pending := func() int {
			return b.count(t, `SELECT count(*) FROM idem_signals WHERE consumed_at IS NULL`)
		}

		_, err = signal(big, "")
		require.ErrorIs(t, err, workflow.ErrLimitExceeded)
		require.EqualError(t, err, `workflow: the payload of signal "other" is 202 bytes, more than the limit of 100 (Config.MaxSignalPayloadBytes); nothing of it was stored`)
		require.Zero(t, pending())

		for i := range 3 {
			_, err := signal(i, "d"+string(rune('0'+i)))
			require.NoError(t, err)
		}
		_, err = signal(3, "")
		var over *workflow.LimitError
		require.ErrorAs(t, err, &over)
		require.Equal(t, "MaxPendingSignals", over.Field)
		require.ErrorContains(t, err, "has 3 signals pending, the most it may (Config.MaxPendingSignals)")
		require.Equal(t, 3, pending(), "nothing recorded")
		res, err := signal(0, "d0")
		require.NoError(t, err, "a duplicate is answered as one, however full the mailbox")
		require.True(t, res.Duplicate)

		// The limit is on signals pending: one consumed makes room for one.
		_, err = b.pool.Exec(b.ctx, `UPDATE idem_signals SET consumed_at = now(), consumed_step = 1 WHERE dedupe_id = 'd0'`)
		require.NoError(t, err)
		_, err = signal(4, "")
		require.NoError(t, err)
		_, err = signal(5, "")
		require.ErrorIs(t, err, workflow.ErrLimitExceeded)
		require.Equal(t, 3, pending())
		require.True(t, errors.Is(err, workflow.ErrLimitExceeded))
	})
}

// TestLimitsParallelAndChildren: a parallel step's output and a child's input are held to the
// same limits as a step's and a run's.
func TestLimitsParallelAndChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	big := strings.Repeat("x", 200)
	child := workflow.Define("child", func(ctx context.Context, in string) (string, error) { return in, nil })
	wf := workflow.Define("parent", func(ctx context.Context, kind string) (string, error) {
		switch kind {
		case "go-call":
			return steps.GoCall(ctx, "fetch", func(context.Context, string) (string, error) { return big, nil }, nil).Get(ctx)
		case "go-tx":
			return steps.GoTx(ctx, "write", func(ctx context.Context, tx pgx.Tx) (string, error) {
				_, err := tx.Exec(ctx, `INSERT INTO effects (run, step) VALUES ('big', 'go-tx')`)
				return big, err
			}, nil).Get(ctx)
		default:
			return steps.Child(ctx, "child", child, big, nil)
		}
	})
	cfg := fastConfig(wf, child)
	cfg.MaxStepOutputBytes, cfg.MaxInputBytes = 100, 100
	e := b.engine(t, cfg)
	e.SetClient(insertOnlyClient(t, b))
	for _, kind := range []string{"go-call", "go-tx", "child"} {
		_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: kind}, kind, nil)
		require.ErrorIs(t, err, workflow.ErrFailed, kind)
		require.ErrorContains(t, err, "is 202 bytes, more than the limit of 100", kind)
	}
	require.Zero(t, b.effects(t, "go-tx"), "the parallel Tx step's write rolled back")
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'child'`), "no child was started")
}
