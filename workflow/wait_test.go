package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

func waitKey(id string) idem.Key { return idem.Key{Scope: "merchant:7", ID: id} }

// effect records a step's write in the step's transaction.
func effect(ctx context.Context, tx pgx.Tx, run, step, note string) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (run, step, note) VALUES ($1, $2, $3)`, run, step, note)
	return err
}

// newSleeper is a workflow that writes, sleeps for d milliseconds, and writes again.
func newSleeper() *workflow.Workflow[int, string] {
	return workflow.Define("sleeper", func(ctx context.Context, ms int) (string, error) {
		if _, err := steps.Tx(ctx, "before", func(ctx context.Context, tx pgx.Tx) (int, error) {
			return 0, effect(ctx, tx, "sleeper", "before", "")
		}, nil); err != nil {
			return "", err
		}
		if err := steps.Sleep(ctx, "nap", time.Duration(ms)*time.Millisecond); err != nil {
			return "", err
		}
		return steps.Tx(ctx, "after", func(ctx context.Context, tx pgx.Tx) (string, error) {
			return "rested", effect(ctx, tx, "sleeper", "after", "")
		}, nil)
	})
}

// runUntilDone calls Run with a long Wait: the River client finishes the run meanwhile.
func runUntilDone[In, Out any](t *testing.T, b *testBundle, wf *workflow.Workflow[In, Out], e *workflow.Engine, key idem.Key, in In) (Out, error) {
	t.Helper()
	return wf.Run(b.ctx, e, key, in, &workflow.RunOpts{Wait: 30 * time.Second})
}

func TestSleep(t *testing.T) {
	t.Parallel()

	t.Run("SuspendsHoldingNothingAndWakes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newSleeper()
		e := b.engine(t, fastConfig(wf))
		client := b.startRiver(t, e)
		_ = client

		_, err := wf.Run(b.ctx, e, waitKey("s1"), 1000, nil)
		require.ErrorIs(t, err, idem.ErrInFlight, "a sleeping run is in flight")
		// Suspended (unless the wake job already came): no lease, a wake-up time, a job for it.
		var state string
		var leased, woken bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT state, lease_token IS NOT NULL, wake_at IS NOT NULL FROM idem_runs`).Scan(&state, &leased, &woken))
		if state == "sleeping" {
			require.False(t, leased, "a sleeping run holds no lease")
			require.True(t, woken)
		}
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake'`))

		out, err := runUntilDone(t, b, wf, e, waitKey("s1"), 1000)
		require.NoError(t, err)
		require.Equal(t, "rested", out)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'before'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'after'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps WHERE kind = 'sleep'`))
		// The sleep lasted at least its time, by Postgres's clock.
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE finished_at >= created_at + interval '1 second'`))
	})

	t.Run("ZeroPassesThrough", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newSleeper()
		e := b.engine(t, fastConfig(wf))
		out, err := wf.Run(b.ctx, e, waitKey("s2"), 0, nil)
		require.NoError(t, err, "a sleep that is over needs neither a River client nor a wake-up")
		require.Equal(t, "rested", out)
		require.Zero(t, b.count(t, `SELECT count(*) FROM river_job`))
	})

	t.Run("SleepUntilThePast", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := workflow.Define("until", func(ctx context.Context, _ int) (int, error) {
			return 1, steps.SleepUntil(ctx, "then", time.Now().Add(-time.Hour))
		})
		e := b.engine(t, fastConfig(wf))
		out, err := wf.Run(b.ctx, e, waitKey("s3"), 0, nil)
		require.NoError(t, err)
		require.Equal(t, 1, out)
	})

	t.Run("WokenEarlySleepsAgainUntilTheSameTime", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newSleeper()
		e := b.engine(t, fastConfig(wf))
		client := b.startRiver(t, e)
		_, err := wf.Run(b.ctx, e, waitKey("s5"), int(time.Hour/time.Millisecond), nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		var created, wakeAt int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (extract(epoch FROM created_at) * 1000000)::int8,
	(extract(epoch FROM wake_at) * 1000000)::int8 FROM idem_runs`).Scan(&created, &wakeAt))
		// A wake job for any step: the run is taken, replays its sleep, and sleeps again.
		_, err = client.Insert(b.ctx, workflow.WakeArgs{Scope: "merchant:7", ID: "s5", Generation: created, Reason: "test"}, nil)
		require.NoError(t, err)
		eventually(t, 20*time.Second, "the run to be woken and sleep again", func() bool {
			return b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'sleeping' AND attempts = 0 AND updated_at > created_at + interval '1 millisecond'
	AND (SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake' AND state = 'completed') = 1`) == 1
		})
		var again int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (extract(epoch FROM wake_at) * 1000000)::int8 FROM idem_runs`).Scan(&again))
		require.Equal(t, wakeAt, again, "the wake-up is the stored one, not a new hour")
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake' AND args->>'reason' = 'timer'`),
			"sleeping again scheduled a wake-up again")
		require.Zero(t, b.count(t, `SELECT count(*) FROM effects WHERE step = 'after'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps WHERE kind = 'sleep'`))
	})

	t.Run("StaleWakeJobsDoNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newSleeper()
		e := b.engine(t, fastConfig(wf))
		client := b.startRiver(t, e)
		out, err := runUntilDone(t, b, wf, e, waitKey("s4"), 10)
		require.NoError(t, err)
		require.Equal(t, "rested", out)
		var created int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (extract(epoch FROM created_at) * 1000000)::int8 FROM idem_runs`).Scan(&created))
		// A finished run, a wrong generation, an unknown key, a step it no longer waits at.
		for _, a := range []workflow.WakeArgs{
			{Scope: "merchant:7", ID: "s4", Generation: created, Seq: 2, Reason: "timer"},
			{Scope: "merchant:7", ID: "s4", Generation: created + 1, Seq: 2, Reason: "signal"},
			{Scope: "merchant:7", ID: "nobody", Generation: created, Seq: 1, Reason: "timer"},
		} {
			_, err := client.Insert(b.ctx, a, nil)
			require.NoError(t, err)
		}
		eventually(t, 20*time.Second, "the stale wake jobs to complete", func() bool {
			return b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake' AND state <> 'completed'`) == 0
		})
		state, _ := b.state(t, waitKey("s4"))
		require.Equal(t, "done", state)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'after'`))
	})
}

// TestLostWakeJob deletes a sleeping run's wake job: the recovery scan wakes the run once it is
// overdue by a scan interval.
func TestLostWakeJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := newSleeper()
	e := b.engine(t, fastConfig(wf))
	// A client that inserts the wake job and works nothing, until the job is gone.
	workers := river.NewWorkers()
	require.NoError(t, e.AddWorkers(workers))
	idle, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Workers: workers, Logger: quietLogger()})
	require.NoError(t, err)
	e.SetClient(idle)
	_, err = wf.Run(b.ctx, e, waitKey("lost"), 300, nil)
	require.ErrorIs(t, err, idem.ErrInFlight)
	_, err = b.pool.Exec(b.ctx, `DELETE FROM river_job WHERE kind = 'idem_workflow_wake'`)
	require.NoError(t, err)

	b.startRiver(t, e)
	out, err := runUntilDone(t, b, wf, e, waitKey("lost"), 300)
	require.NoError(t, err)
	require.Equal(t, "rested", out)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake' AND args->>'reason' = 'scan'`))
}

func TestDeadline(t *testing.T) {
	t.Parallel()

	t.Run("DuringSleep", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newSleeper()
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		_, err := wf.Run(b.ctx, e, waitKey("d1"), int(time.Hour/time.Millisecond), &workflow.RunOpts{Timeout: time.Second})
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.Equal(t, "timed_out", b.waitFinished(t, waitKey("d1")), "the wake job at the deadline times the run out")

		_, err = wf.Run(b.ctx, e, waitKey("d1"), int(time.Hour/time.Millisecond), nil)
		require.ErrorIs(t, err, workflow.ErrDeadlineExceeded, "replayed to retries")
		var timedOut *workflow.TimedOutError
		require.ErrorAs(t, err, &timedOut)
		require.Equal(t, "d1", timedOut.ID)
		require.Zero(t, b.count(t, `SELECT count(*) FROM effects WHERE step = 'after'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE lease_token IS NULL AND expires_at IS NOT NULL`))
	})

	t.Run("DuringAnAwait", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newAwaiter(nil)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		req := awaitReq{Count: 1} // no timeout of its own
		_, err := wf.Run(b.ctx, e, waitKey("d5"), req, &workflow.RunOpts{Timeout: time.Second})
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.Equal(t, "timed_out", b.waitFinished(t, waitKey("d5")))
		require.ErrorIs(t, b.inTx(func(ctx context.Context, t pgx.Tx) error {
			_, err := e.SignalTx(ctx, t, waitKey("d5"), "tick", "too late", nil)
			return err
		}), workflow.ErrRunFinished)
		_, err = wf.Run(b.ctx, e, waitKey("d5"), req, nil)
		require.ErrorIs(t, err, workflow.ErrDeadlineExceeded)
	})

	t.Run("AtTheNextStepBoundary", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := workflow.Define("slow", func(ctx context.Context, _ int) (int, error) {
			_, err := steps.Call(ctx, "slow", func(ctx context.Context, _ string) (int, error) {
				// Outlive the deadline, by Postgres's clock.
				for {
					var over bool
					if err := b.pool.QueryRow(ctx, `SELECT coalesce(bool_and(deadline <= now()), false) FROM idem_runs`).Scan(&over); err != nil {
						return 0, err
					}
					if over {
						return 1, nil
					}
					time.Sleep(20 * time.Millisecond)
				}
			}, nil)
			if err != nil {
				return 0, err
			}
			return steps.Tx(ctx, "after", func(ctx context.Context, tx pgx.Tx) (int, error) {
				return 2, effect(ctx, tx, "slow", "after", "")
			}, nil)
		})
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, waitKey("d2"), 0, &workflow.RunOpts{Timeout: time.Second})
		require.ErrorIs(t, err, workflow.ErrDeadlineExceeded)
		state, _ := b.state(t, waitKey("d2"))
		require.Equal(t, "timed_out", state)
		require.Zero(t, b.count(t, `SELECT count(*) FROM effects`), "no step runs after the deadline")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps WHERE name = 'slow'`), "the step in progress was kept")
		_, err = wf.Run(b.ctx, e, waitKey("d2"), 0, nil)
		require.ErrorIs(t, err, workflow.ErrDeadlineExceeded)
	})

	t.Run("FinishedInTime", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newSleeper()
		e := b.engine(t, fastConfig(wf))
		out, err := wf.Run(b.ctx, e, waitKey("d3"), 0, &workflow.RunOpts{Timeout: time.Hour})
		require.NoError(t, err)
		require.Equal(t, "rested", out)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE deadline = created_at + interval '1 hour'`))
	})

	t.Run("NegativeIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newSleeper()
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, waitKey("d4"), 0, &workflow.RunOpts{Timeout: -time.Second})
		require.ErrorContains(t, err, "RunOpts.Timeout cannot be negative")
	})
}
