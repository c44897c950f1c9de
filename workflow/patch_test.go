package workflow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// The payout in three versions: v1 reserves, cools off and charges; v2 inserts a fraud check
// before the cool-off, behind a patch; v2Unpatched inserts it without one. Each step records
// that it ran in the calls table, by run.
const coolOff = 300 * time.Millisecond

func payoutVersion(b *testBundle, version string) *workflow.Workflow[string, string] {
	call := func(ctx context.Context, step, run string) error {
		_, err := steps.Call(ctx, step, func(ctx context.Context, key string) (int, error) {
			_, err := b.pool.Exec(context.WithoutCancel(ctx), `INSERT INTO calls (run, step, key) VALUES ($1, $2, $3)`, run, step, key)
			return 0, err
		}, nil)
		return err
	}
	return workflow.Define("payout", func(ctx context.Context, run string) (string, error) {
		if err := call(ctx, "reserve", run); err != nil {
			return "", err
		}
		switch version {
		case "v2":
			patched, err := workflow.Patched(ctx, "fraud-check")
			if err != nil {
				return "", err
			}
			if patched {
				if err := call(ctx, "fraud-check", run); err != nil {
					return "", err
				}
			}
		case "v2-unpatched":
			if err := call(ctx, "fraud-check", run); err != nil {
				return "", err
			}
		case "v3":
			if err := workflow.Deprecated(ctx, "fraud-check"); err != nil {
				return "", err
			}
			if err := call(ctx, "fraud-check", run); err != nil {
				return "", err
			}
		}
		if err := steps.Sleep(ctx, "cool-off", coolOff); err != nil {
			return "", err
		}
		if err := call(ctx, "charge", run); err != nil {
			return "", err
		}
		return "paid " + run, nil
	})
}

// insertOnly gives e an insert-only River client (no workers), as a process whose River client
// is not working jobs: its runs' wake-ups wait for another process.
func insertOnly(t *testing.T, b *testBundle, e *workflow.Engine) {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Logger: quietLogger()})
	require.NoError(t, err)
	e.SetClient(client)
}

// stepsOf returns the run's history as "kind:name" in order.
func (b *testBundle) stepsOf(t *testing.T, run string) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT kind || ':' || name FROM idem_steps WHERE id = $1 ORDER BY seq`, run)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// TestPatched is the path of a change under running runs: a run started on v1 and asleep when
// v2 (with a patch) is deployed takes the old branch when it wakes, a new run the new one; a v2
// without the patch fails the old run as nondeterministic at once, and once the patch is
// deployed RunResume finishes it.
func TestPatched(t *testing.T) {
	t.Parallel()

	// asleepOnV1 starts run on v1, which sleeps in the cool-off with nobody to wake it.
	asleepOnV1 := func(t *testing.T, b *testBundle, run string) idem.Key {
		t.Helper()
		v1 := payoutVersion(b, "v1")
		cfg := fastConfig(v1)
		cfg.Version = "v1"
		e1 := b.engine(t, cfg)
		insertOnly(t, b, e1)
		key := idem.Key{Scope: "s", ID: run}
		_, err := v1.Run(b.ctx, e1, key, run, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		state, _ := b.state(t, key)
		require.Equal(t, "sleeping", state)
		return key
	}
	engineOf := func(t *testing.T, b *testBundle, version string, cfgs ...func(*workflow.Config)) (*workflow.Workflow[string, string], *workflow.Engine) {
		wf := payoutVersion(b, version)
		cfg := fastConfig(wf)
		cfg.Version = version
		for _, f := range cfgs {
			f(cfg)
		}
		return wf, b.engine(t, cfg)
	}
	calls := func(b *testBundle, t *testing.T, run, step string) int {
		return b.count(t, `SELECT count(*) FROM calls WHERE run = $1 AND step = $2`, run, step)
	}

	t.Run("OldRunTakesTheOldBranchNewRunTheNew", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		old := asleepOnV1(t, b, "old")

		v2, e2 := engineOf(t, b, "v2")
		river2 := b.startRiver(t, e2) // v2 is deployed; its workers wake the old run
		require.Equal(t, "done", b.waitFinished(t, old))
		out, err := v2.Run(b.ctx, e2, old, "old", nil)
		require.NoError(t, err)
		require.Equal(t, "paid old", out)
		require.Zero(t, calls(b, t, "old", "fraud-check"), "the old run had passed the patch's point")
		require.Equal(t, []string{"call:reserve", "sleep:cool-off", "call:charge"}, b.stepsOf(t, "old"), "and records no marker")

		_, err = v2.Run(b.ctx, e2, idem.Key{Scope: "s", ID: "new"}, "new", &workflow.RunOpts{Wait: 20 * time.Second})
		require.NoError(t, err)
		require.Equal(t, 1, calls(b, t, "new", "fraud-check"), "a new run takes the patched branch")
		require.Equal(t, []string{"call:reserve", "patch:fraud-check", "call:fraud-check", "sleep:cool-off", "call:charge"}, b.stepsOf(t, "new"))
		for _, step := range []string{"reserve", "charge"} {
			require.Equal(t, 1, calls(b, t, "old", step))
			require.Equal(t, 1, calls(b, t, "new", step))
		}

		// Deploy 3: no run of v1 is left, so the old branch goes and the patch is deprecated. A
		// run with the marker replays as it ran (a fork of the new run, all its steps copied,
		// replays them all), and a new run records no marker.
		stopRiver(t, river2)
		v3, e3 := engineOf(t, b, "v3")
		b.startRiver(t, e3)
		fork := idem.Key{Scope: "s", ID: "new-fork"}
		require.NoError(t, e3.RunFork(b.ctx, idem.Key{Scope: "s", ID: "new"}, fork, 6))
		require.Equal(t, "done", b.waitFinished(t, fork))
		require.Equal(t, b.stepsOf(t, "new"), b.stepsOf(t, "new-fork"))
		require.Equal(t, 1, calls(b, t, "new", "fraud-check"), "the fork ran nothing again")
		_, err = v3.Run(b.ctx, e3, idem.Key{Scope: "s", ID: "newer"}, "newer", &workflow.RunOpts{Wait: 20 * time.Second})
		require.NoError(t, err)
		require.Equal(t, []string{"call:reserve", "call:fraud-check", "sleep:cool-off", "call:charge"}, b.stepsOf(t, "newer"))
	})

	t.Run("WithoutThePatchTheRunFailsAtOnceAndResumesOnceItIsDeployed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := asleepOnV1(t, b, "old")

		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		unpatched, e2 := engineOf(t, b, "v2-unpatched", func(c *workflow.Config) { c.MeterProvider = mp })
		river2 := b.startRiver(t, e2)
		require.Equal(t, "failed", b.waitFinished(t, key))
		state, attempts := b.state(t, key)
		require.Equal(t, "failed", state)
		require.Equal(t, 1, attempts, "one attempt, not Config.MaxAttempts: retries cannot make the code match")
		require.Zero(t, calls(b, t, "old", "fraud-check"))
		require.Zero(t, calls(b, t, "old", "charge"))

		_, err := unpatched.Get(b.ctx, e2, key)
		require.ErrorIs(t, err, workflow.ErrNonDeterminism)
		run, err := e2.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.FailureNondeterministic, run.Reason)
		require.Equal(t, workflow.Divergence{Seq: 2, StoredKind: "sleep", StoredName: "cool-off", CalledKind: "call", CalledName: "fraud-check"}, *run.Divergence)
		require.Equal(t, "v2-unpatched", run.AttemptVersion)
		require.Contains(t, run.Error, `diverged from the run's history at step #2: the history has sleep "cool-off" there, but the code called call "fraud-check"`)
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(b.ctx, &rm))
		require.Equal(t, map[string]int64{"payout": 1}, sums(rm, "idem.workflow.nondeterministic", "idem.workflow"))

		// The patch is deployed (the unpatched processes are gone), and an operator resumes the run.
		stopRiver(t, river2)
		_, e3 := engineOf(t, b, "v2")
		b.startRiver(t, e3)
		require.NoError(t, e3.RunResume(b.ctx, key))
		require.Equal(t, "done", b.waitFinished(t, key))
		require.Zero(t, calls(b, t, "old", "fraud-check"), "it took the old branch")
		require.Equal(t, 1, calls(b, t, "old", "charge"))
		run, err = e3.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Empty(t, run.Reason)
		require.Nil(t, run.Divergence)
	})
}

// stopRiver stops a client started by startRiver, as a deploy stops the old processes.
func stopRiver(t *testing.T, client *river.Client[pgx.Tx]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, client.Stop(ctx))
}

// TestPatchedBadInput: an empty change id, or one used twice in a run, is an error at that call;
// outside a workflow too.
func TestPatchedBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var errs []error
	wf := workflow.Define("bad-patches", func(ctx context.Context, in int) (int, error) {
		_, err := workflow.Patched(ctx, "")
		errs = append(errs, err)
		_, err = workflow.Patched(ctx, "a")
		errs = append(errs, err)
		_, err = steps.Call(ctx, "step", func(context.Context, string) (int, error) { return 1, nil }, nil)
		errs = append(errs, err)
		_, err = workflow.Patched(ctx, "a")
		errs = append(errs, err)
		errs = append(errs, workflow.Deprecated(ctx, "a"))
		errs = append(errs, workflow.Deprecated(ctx, ""))
		return 0, errors.Join(errs...)
	})
	e := b.engine(t, fastConfig(wf))
	_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "k"}, 1, nil)
	require.ErrorIs(t, err, workflow.ErrFailed)
	require.Len(t, errs, 6)
	require.ErrorContains(t, errs[0], "Patched needs a change id")
	require.NoError(t, errs[1])
	require.NoError(t, errs[2])
	require.ErrorContains(t, errs[3], `change id "a" is used twice in one run, at step #1 and again at step #3`)
	require.ErrorContains(t, errs[4], `change id "a" is used twice`)
	require.ErrorContains(t, errs[5], "Deprecated needs a change id")

	_, err = workflow.Patched(b.ctx, "x")
	require.ErrorContains(t, err, "outside a workflow")
	require.ErrorContains(t, workflow.Deprecated(b.ctx, "x"), "outside a workflow")
}
