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

type progress struct {
	Stage string `json:"stage"`
}

// newPublisher publishes its stage, waits for "go", and publishes again.
func newPublisher() *workflow.Workflow[int, string] {
	return workflow.Define("publisher", func(ctx context.Context, _ int) (string, error) {
		if err := steps.SetEvent(ctx, "progress", progress{Stage: "waiting"}); err != nil {
			return "", err
		}
		if _, err := steps.Await[string](ctx, "go", "go", 0); err != nil {
			return "", err
		}
		if err := steps.SetEvent(ctx, "progress", progress{Stage: "done"}); err != nil {
			return "", err
		}
		return "ok", nil
	})
}

func TestEvent(t *testing.T) {
	t.Parallel()

	t.Run("SetAndReadWithWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newPublisher()
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		key := waitKey("e1")

		// A reader that comes before the run waits for it.
		read := make(chan progress, 1)
		go func() {
			p, err := workflow.GetEvent[progress](b.ctx, e, key, "progress", 20*time.Second)
			if err != nil {
				p.Stage = err.Error()
			}
			read <- p
		}()
		_, err := wf.Run(b.ctx, e, key, 0, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.Equal(t, progress{Stage: "waiting"}, <-read, "published before the run suspended")

		require.NoError(t, b.inTx(func(ctx context.Context, t pgx.Tx) error {
			_, err := e.SignalTx(ctx, t, key, "go", nil, nil)
			return err
		}))
		out, err := runUntilDone(t, b, wf, e, key, 0)
		require.NoError(t, err)
		require.Equal(t, "ok", out)
		p, err := workflow.GetEvent[progress](b.ctx, e, key, "progress", 0)
		require.NoError(t, err)
		require.Equal(t, progress{Stage: "done"}, p, "the last write wins")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_events`))
	})

	t.Run("NotSet", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newPublisher()
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		key := waitKey("e2")
		_, err := wf.Run(b.ctx, e, key, 0, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)

		_, err = e.EventGet(b.ctx, key, "other", 50*time.Millisecond)
		require.ErrorIs(t, err, workflow.ErrEventNotSet, "a running run that has not set it, after the wait")
		_, err = e.EventGet(b.ctx, waitKey("nobody"), "progress", 0)
		require.ErrorIs(t, err, workflow.ErrRunNotFound)

		require.NoError(t, b.inTx(func(ctx context.Context, t pgx.Tx) error {
			_, err := e.SignalTx(ctx, t, key, "go", nil, nil)
			return err
		}))
		_, err = runUntilDone(t, b, wf, e, key, 0)
		require.NoError(t, err)
		// A finished run will never set it: no need to wait.
		_, err = e.EventGet(b.ctx, key, "other", time.Hour)
		require.ErrorIs(t, err, workflow.ErrEventNotSet)
	})
}

// TestReapDeletesSignalsAndEvents checks that a reaped run takes its mailbox and its events
// with it, so that a new run under the same key starts empty.
func TestReapDeletesSignalsAndEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := newPublisher()
	cfg := fastConfig(wf)
	cfg.TTL = time.Second
	e := b.engine(t, cfg)
	b.startRiver(t, e)
	key := waitKey("reaped")
	_, err := wf.Run(b.ctx, e, key, 0, nil)
	require.ErrorIs(t, err, idem.ErrInFlight)
	// Both in one transaction: once "go" commits, the run may finish before a second
	// transaction could signal it.
	require.NoError(t, b.inTx(func(ctx context.Context, t pgx.Tx) error {
		for _, name := range []string{"go", "unread"} {
			if _, err := e.SignalTx(ctx, t, key, name, nil, nil); err != nil {
				return err
			}
		}
		return nil
	}))
	_, err = runUntilDone(t, b, wf, e, key, 0)
	require.NoError(t, err)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_signals`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_events`))

	eventually(t, 20*time.Second, "the run to be reaped", func() bool {
		_, err := workflow.Reap(b.ctx, e)
		require.NoError(t, err)
		return b.count(t, `SELECT count(*) FROM idem_runs`) == 0
	})
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_signals`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_events`))
}
