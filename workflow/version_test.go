package workflow_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// TestVersions: a run records the code version that started it and that of its latest attempt,
// a failed step attempt the version it ran on, RunList filters on the start's, and an engine with
// ResumeVersions leaves the runs of other versions to their own.
func TestVersions(t *testing.T) {
	t.Parallel()

	// versioned is a workflow of two Calls whose first fails once, and whose process dies before
	// the second when crash is set.
	versioned := func(crash *atomic.Pointer[context.CancelFunc]) *workflow.Workflow[int, string] {
		var failed atomic.Bool
		return workflow.Define("versioned", func(ctx context.Context, in int) (string, error) {
			if _, err := steps.Call(ctx, "first", func(ctx context.Context, key string) (int, error) {
				if failed.CompareAndSwap(false, true) {
					return 0, errors.New("flaky")
				}
				return 1, nil
			}, &steps.Opts{MinBackoff: time.Millisecond}); err != nil {
				return "", err
			}
			if cancel := crash.Swap(nil); cancel != nil {
				(*cancel)()
				return "", ctx.Err()
			}
			return steps.Call(ctx, "second", func(ctx context.Context, key string) (string, error) { return "ok", nil }, nil)
		})
	}
	versionConfig := func(wf workflow.Definition, version string, resume ...string) *workflow.Config {
		cfg := fastConfig(wf)
		cfg.Version, cfg.ResumeVersions = version, resume
		return cfg
	}
	// crashedRun starts a run on an engine of version v1 whose process dies after the first step.
	crashedRun := func(t *testing.T, b *testBundle, wf *workflow.Workflow[int, string], crash *atomic.Pointer[context.CancelFunc], key idem.Key) {
		t.Helper()
		ctx, cancel := context.WithCancel(b.ctx)
		crash.Store(&cancel)
		_, err := wf.Run(ctx, b.engine(t, versionConfig(wf, "v1")), key, 1, nil)
		require.ErrorIs(t, err, context.Canceled)
		b.waitLeaseExpired(t, key)
	}

	t.Run("Recorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var crash atomic.Pointer[context.CancelFunc]
		wf := versioned(&crash)
		e := b.engine(t, versionConfig(wf, "v1"))
		key := idem.Key{Scope: "s", ID: "k"}
		out, err := wf.Run(b.ctx, e, key, 1, nil)
		require.NoError(t, err)
		require.Equal(t, "ok", out)
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, "v1", run.Version)
		require.Equal(t, "v1", run.AttemptVersion)
		require.Len(t, run.Failures, 1)
		require.Equal(t, "v1", run.Failures[0].Version, "a failed attempt names the version it ran on")
	})

	t.Run("DefaultIsTheBuildsOrUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var crash atomic.Pointer[context.CancelFunc]
		wf := versioned(&crash)
		e := b.engine(t, fastConfig(wf))
		key := idem.Key{Scope: "s", ID: "k"}
		_, err := wf.Run(b.ctx, e, key, 1, nil)
		require.NoError(t, err)
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.UnknownVersion, run.Version, "a test binary carries no VCS revision")
	})

	t.Run("TakeoverRecordsItsVersion", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var crash atomic.Pointer[context.CancelFunc]
		wf := versioned(&crash)
		key := idem.Key{Scope: "s", ID: "k"}
		crashedRun(t, b, wf, &crash, key)

		e2 := b.engine(t, versionConfig(wf, "v2"))
		out, err := wf.Run(b.ctx, e2, key, 1, nil)
		require.NoError(t, err)
		require.Equal(t, "ok", out)
		run, err := e2.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, "v1", run.Version, "the run stays the version that started it")
		require.Equal(t, "v2", run.AttemptVersion)
		require.Equal(t, 2, run.Attempts)

		res, err := e2.RunList(b.ctx, &workflow.RunListParams{Versions: []string{"v1"}})
		require.NoError(t, err)
		require.Len(t, res.Runs, 1)
		res, err = e2.RunList(b.ctx, &workflow.RunListParams{Versions: []string{"v2"}})
		require.NoError(t, err)
		require.Empty(t, res.Runs, "the filter is on the version that started the run")
	})

	t.Run("ResumeVersionsLeaveOtherVersionsRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var crash atomic.Pointer[context.CancelFunc]
		wf := versioned(&crash)
		key := idem.Key{Scope: "s", ID: "k"}
		crashedRun(t, b, wf, &crash, key)

		var logs syncBuffer
		cfg := versionConfig(wf, "v2", "v2")
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		e2 := b.engine(t, cfg)
		_, err := wf.Run(b.ctx, e2, key, 1, nil)
		require.ErrorIs(t, err, idem.ErrInFlight, "a call of v2 does not take over a run of v1")
		require.Contains(t, logs.String(), "leaving run to an engine of its version")
		require.Contains(t, logs.String(), "run_version=v1")

		// v2's River workers take the resume job the scan inserts, and give it back.
		b.startRiver(t, e2)
		eventually(t, 10*time.Second, "the resume job to leave the run", func() bool {
			return strings.Contains(logs.String(), "by=job")
		})
		state, attempts := b.state(t, key)
		require.Equal(t, "running", state)
		require.Equal(t, 1, attempts, "nothing of v2 ran it")

		// An engine of v1 that resumes only its own runs takes it up.
		e1 := b.engine(t, versionConfig(wf, "v1", "v1"))
		out, err := wf.Run(b.ctx, e1, key, 1, nil)
		require.NoError(t, err)
		require.Equal(t, "ok", out)
		run, err := e1.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, "v1", run.AttemptVersion)
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := workflow.NewEngine(b.pool, &workflow.Config{ResumeVersions: []string{"v1", ""}})
		require.ErrorContains(t, err, "ResumeVersions[1] cannot be empty")
		_, err = workflow.NewEngine(b.pool, &workflow.Config{Version: string(make([]byte, 256))})
		require.ErrorContains(t, err, "Version cannot be longer than 255 bytes")
	})
}
