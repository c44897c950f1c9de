package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/tx"
	"github.com/idemkit/idem/workflow"
)

// awaitingAtThirdStep starts an awaiter that consumes evt_1 and then awaits its second signal
// at step #3, and returns with River stopped and an insert-only client in its place, so that
// the test decides which wake jobs run.
func awaitingAtThirdStep(t *testing.T, b *testBundle, id string) (*workflow.Engine, idem.Key) {
	t.Helper()
	wf := newAwaiter(nil)
	e := b.engine(t, fastConfig(wf))
	key := waitKey(id)
	client := b.startRiver(t, e)
	_, err := wf.Run(b.ctx, e, key, awaitReq{Count: 2}, nil) // no timeout: only a signal wakes it
	require.ErrorIs(t, err, idem.ErrInFlight)
	b.signal(t, e, key, "evt_1", &workflow.SignalOpts{DedupeID: "evt_1"})
	eventually(t, 10*time.Second, "the run to await its second signal", func() bool {
		return b.count(t, `SELECT count(*) FROM idem_runs WHERE id = $1 AND state = 'awaiting' AND wait_seq = 3`, key.ID) == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, client.StopAndCancel(ctx))
	e.SetClient(insertOnlyClient(t, b))
	return e, key
}

// TestMailbox holds the promises about which signals wake a run: a duplicate wakes nothing, a
// wake job of an earlier wait never swallows a new signal's, and a run's mailbox goes with it.
func TestMailbox(t *testing.T) {
	t.Parallel()

	t.Run("DuplicateSignalWakesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e, key := awaitingAtThirdStep(t, b, "dup")
		before := b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake'`)
		res := b.signal(t, e, key, "evt_1", &workflow.SignalOpts{DedupeID: "evt_1"}) // the webhook again
		require.True(t, res.Duplicate)
		require.Equal(t, before, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake'`),
			"a duplicate records nothing, so it has nothing to wake the run for")
	})

	t.Run("AnEarlierWaitsWakeJobDoesNotSwallowANewSignal", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e, key := awaitingAtThirdStep(t, b, "stale")
		// A wake job of an earlier wait at the same step (before a cancel and resume, say) is
		// still running in River when a new signal commits.
		var created int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (extract(epoch FROM created_at) * 1000000)::int8 FROM idem_runs WHERE id = $1`, key.ID).Scan(&created))
		stale := workflow.WakeArgs{Scope: key.Scope, ID: key.ID, Generation: created, Seq: 3, Reason: "signal", Suspended: created + 1}
		client := insertOnlyClient(t, b)
		_, err := client.Insert(b.ctx, stale, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}})
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE kind = 'idem_workflow_wake' AND state = 'available'`)
		require.NoError(t, err)

		res := b.signal(t, e, key, "evt_2", &workflow.SignalOpts{DedupeID: "evt_2"})
		require.False(t, res.Duplicate)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake' AND state = 'available'`),
			"the new signal's wake job must be inserted beside the running one")
		_, err = b.pool.Exec(b.ctx, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE state = 'running'`)
		require.NoError(t, err)
		b.startRiver(t, e)
		require.Equal(t, "done", b.waitFinished(t, key))
	})

	t.Run("RunGetShowsTheWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e, key := awaitingAtThirdStep(t, b, "shown")
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateAwaiting, run.State)
		require.Equal(t, "tick", run.AwaitingSignal)
		require.Nil(t, run.WakeAt, "an await without a timeout wakes only for its signal")
		require.Zero(t, run.PendingSignals)
		b.signal(t, e, key, "evt_2", nil) // River is stopped: the signal waits in the mailbox
		run, err = e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, 1, run.PendingSignals)
		page, err := e.RunList(b.ctx, &workflow.RunListParams{States: []workflow.RunState{workflow.RunStateAwaiting}})
		require.NoError(t, err)
		require.Len(t, page.Runs, 1)
		require.Equal(t, 1, page.Runs[0].PendingSignals)
	})

	t.Run("DoOnAnExpiredRunsKeyClearsItsMailbox", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newAwaiter(nil)
		cfg := fastConfig(wf)
		cfg.TTL = time.Second
		e := b.engine(t, cfg)
		key := waitKey("reused")
		client := b.startRiver(t, e)
		_, err := wf.Run(b.ctx, e, key, awaitReq{Count: 1}, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			if _, err := e.SignalTx(ctx, t, key, "tick", "old-a", nil); err != nil {
				return err
			}
			_, err := e.SignalTx(ctx, t, key, "tick", "old-b", nil) // left in the mailbox
			return err
		}))
		require.Equal(t, "done", b.waitFinished(t, key))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		require.NoError(t, client.StopAndCancel(ctx)) // no reaper from here on
		cancel()
		e.SetClient(insertOnlyClient(t, b))
		eventually(t, 10*time.Second, "the run to expire", func() bool {
			return b.count(t, `SELECT count(*) FROM idem_runs WHERE id = $1 AND expires_at <= now()`, key.ID) == 1
		})

		// idem.Do takes the expired run's key: the run goes, and its mailbox with it.
		require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			_, err := idem.Do(ctx, t, key, func(ctx context.Context, t pgx.Tx) (int, error) { return 1, nil }, idem.TTL(time.Second))
			return err
		}))
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_signals WHERE id = $1`, key.ID))
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_events WHERE id = $1`, key.ID))
	})
}

// TestResumeOfAFailedRunGivesBackWhatTheCutStepsConsumed: the steps a resume cuts from a failed
// run did not happen, so the signals they consumed are pending again.
func TestResumeOfAFailedRunGivesBackWhatTheCutStepsConsumed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var broken atomic.Bool
	broken.Store(true)
	wf := workflow.Define("cutter", func(ctx context.Context, in int) (string, error) {
		_, err := steps.Call(ctx, "charge", func(ctx context.Context, _ string) (int, error) {
			if broken.Load() {
				return 0, steps.Permanent(errors.New("provider bug"))
			}
			return 1, nil
		}, nil)
		v, aerr := steps.Await[string](ctx, "confirm", "tick", 0)
		if aerr != nil {
			return "", aerr
		}
		if err != nil {
			return "", fmt.Errorf("charge failed (confirmation %s): %w", v, err)
		}
		return v, nil
	})
	e := b.engine(t, fastConfig(wf))
	b.startRiver(t, e)
	key := waitKey("cut")
	_, err := wf.Run(b.ctx, e, key, 1, nil)
	require.ErrorIs(t, err, idem.ErrInFlight)
	b.signal(t, e, key, "evt_1", &workflow.SignalOpts{DedupeID: "evt_1"})
	require.Equal(t, "failed", b.waitFinished(t, key))

	broken.Store(false) // the operator fixed the bug
	require.NoError(t, e.RunResume(b.ctx, key))
	require.Equal(t, "done", b.waitFinished(t, key), "the rerun's await gets the signal back")
	out, err := wf.Run(b.ctx, e, key, 1, nil)
	require.NoError(t, err)
	require.Equal(t, "evt_1", out)
}
