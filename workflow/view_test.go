package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

func TestRunCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.Define("counted", func(ctx context.Context, fail bool) (int, error) {
		return steps.Tx(ctx, "one", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if fail {
				return 0, steps.Permanent(errString("no"))
			}
			return 1, nil
		}, nil)
	})
	e := b.engine(t, fastConfig(wf))
	for i, fail := range []bool{false, false, true} {
		_, _ = wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: string(rune('a' + i))}, fail, nil)
	}

	counts, err := e.RunCounts(b.ctx, 0)
	require.NoError(t, err)
	require.Equal(t, []workflow.RunCount{{State: workflow.RunStateDone, N: 2}, {State: workflow.RunStateFailed, N: 1}}, counts)

	_, err = e.RunCounts(b.ctx, -1)
	require.ErrorContains(t, err, "exactUpTo cannot be negative")
}

type errString string

func (e errString) Error() string { return string(e) }

func TestRunActivity(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.Define("active", func(ctx context.Context, _ int) (string, error) {
		if err := steps.SetEvent(ctx, "status", "waiting"); err != nil {
			return "", err
		}
		return steps.Await[string](ctx, "go", "tick", 0)
	})
	e := b.engine(t, fastConfig(wf))
	b.startRiver(t, e)
	key := idem.Key{Scope: "s", ID: "r"}
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(t pgx.Tx) error {
		return wf.StartTx(b.ctx, e, t, key, 1, nil)
	}))
	eventually(t, 10*time.Second, "the run awaits", func() bool { s, _ := b.state(t, key); return s == "awaiting" })
	// One signal the await consumes, and one no await takes, which stays pending.
	b.signal(t, e, key, "one", &workflow.SignalOpts{DedupeID: "evt-1"})
	b.waitFinished(t, key)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO idem_signals (scope, id, name, payload) VALUES ('s', 'r', 'late', '"x"')`)
	require.NoError(t, err)

	act, err := e.RunActivity(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, 2, act.SignalsTotal)
	require.Len(t, act.Signals, 2)
	require.Equal(t, "tick", act.Signals[0].Name)
	require.Equal(t, "evt-1", act.Signals[0].DedupeID)
	require.JSONEq(t, `"one"`, string(act.Signals[0].Payload))
	require.NotNil(t, act.Signals[0].Consumed, "the await consumed it")
	require.Equal(t, 2, *act.Signals[0].ConsumedStep)
	require.Nil(t, act.Signals[1].Consumed)
	require.Len(t, act.Events, 1)
	require.Equal(t, "status", act.Events[0].Name)
	require.JSONEq(t, `"waiting"`, string(act.Events[0].Value))
	require.Empty(t, act.TraceID, "no span started it")

	t.Run("NotFound", func(t *testing.T) {
		_, err := e.RunActivity(b.ctx, idem.Key{Scope: "s", ID: "none"})
		require.ErrorIs(t, err, idem.ErrNotFound)
		_, err = e.RunActivity(b.ctx, idem.Key{Scope: "s", ID: ""})
		require.ErrorIs(t, err, idem.ErrInvalidKey)
	})
}

func TestTraceID(t *testing.T) {
	t.Parallel()
	for tp, want := range map[string]string{
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01": "0af7651916cd43dd8448eb211c80319c",
		"00-00000000000000000000000000000000-b7ad6b7169203331-01": "",
		"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01": "",
		"<script>":      "",
		"":              "",
		"00-abc-def-01": "",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331": "",
	} {
		require.Equal(t, want, workflow.TraceIDOf(tp), tp)
	}
}
