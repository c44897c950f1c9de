package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/tx"
	"github.com/idemkit/idem/workflow"
)

// TestKeyOwnership checks the one key namespace: a key belongs to idem.Do or to a run, and
// using it as the other is refused at once with idem.ErrMismatch naming the owner, never
// answered with ErrInFlight or a wait, whether the two meet across transactions or in one.
func TestKeyOwnership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	echo := workflow.Define("echo", func(ctx context.Context, in int) (int, error) { return in, nil })
	// hold is a workflow that stays running, in its first step, until its context ends: its
	// key is in flight. (The first step is a Call, so the run's row is written before it.)
	hold := workflow.Define("hold", func(ctx context.Context, in int) (int, error) {
		return steps.Call(ctx, "wait", func(ctx context.Context, _ string) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		}, nil)
	})
	doKey := func(ctx context.Context, t pgx.Tx, k idem.Key) (int, error) {
		return idem.Do(ctx, t, k, func(context.Context, pgx.Tx) (int, error) { return 1, nil })
	}
	quick := func(t *testing.T) func() {
		start := time.Now()
		return func() { require.Less(t, time.Since(start), 3*time.Second, "refused at once, not after a wait") }
	}

	t.Run("RunUnderADoKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e := b.engine(t, fastConfig(echo))
		k := idem.Key{Scope: "s", ID: "k"}
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, t pgx.Tx) error { _, err := doKey(ctx, t, k); return err }))
		done := quick(t)
		_, err := echo.Run(ctx, e, k, 1, &workflow.RunOpts{Wait: 5 * time.Second})
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.ErrorContains(t, err, "belongs to idem.Do")
		done()
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs`))
	})

	t.Run("DoUnderARunningRunsKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e := b.engine(t, fastConfig(hold))
		k := idem.Key{Scope: "s", ID: "k"}
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _, _ = hold.Run(runCtx, e, k, 1, nil) }()
		eventually(t, 10*time.Second, "the run to start", func() bool {
			return b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'running'`) == 1
		})
		done := quick(t)
		err := tx.Run(ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			_, err := doKey(ctx, t, k)
			return err
		})
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.NotErrorIs(t, err, idem.ErrInFlight)
		require.ErrorContains(t, err, `workflow "hold"`)
		done()
	})

	t.Run("StartTxInsideDoUnderDosKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e := b.engine(t, fastConfig(echo))
		b.startRiver(t, e)
		k := idem.Key{Scope: "s", ID: "request-1"}
		done := quick(t)
		attempts := 0
		err := tx.Run(ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			attempts++
			_, err := idem.Do(ctx, t, k, func(ctx context.Context, t pgx.Tx) (int, error) {
				return 0, echo.StartTx(ctx, e, t, k, 1) // the trap: the request's own key
			})
			return err
		})
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.ErrorContains(t, err, `"request-1:echo"`, "the message says what to do")
		require.Equal(t, 1, attempts, "not retried to no end")
		done()
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys`))
	})

	t.Run("DoAfterStartTxInOneTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e := b.engine(t, fastConfig(echo))
		b.startRiver(t, e)
		k := idem.Key{Scope: "s", ID: "k"}
		done := quick(t)
		err := tx.Run(ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			if err := echo.StartTx(ctx, e, t, k, 1); err != nil {
				return err
			}
			_, err := doKey(ctx, t, k)
			return err
		})
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.ErrorContains(t, err, `workflow "echo"`)
		done()
	})

	t.Run("AnotherWorkflowsKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e := b.engine(t, fastConfig(echo, hold))
		k := idem.Key{Scope: "s", ID: "k"}
		_, err := echo.Run(ctx, e, k, 1, nil)
		require.NoError(t, err)
		done := quick(t)
		_, err = hold.Run(ctx, e, k, 1, nil)
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.ErrorContains(t, err, `workflow "echo"`)
		done()
	})
}
