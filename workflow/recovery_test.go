package workflow_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// TestRecoveryAfterAbandon stops a run at every step boundary by cancelling its context, which
// leaves the run with its lease as a dead process would, and lets River resume it.
func TestRecoveryAfterAbandon(t *testing.T) {
	t.Parallel()

	points := []string{
		"before:reserve", "in:reserve", // before the step; after its write, before its commit
		"before:charge", "in:charge", // after the outside effect, before the checkpoint
		"before:settle", "in:settle",
		"end", // after the last step, before the outcome is stored
	}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			key := idem.Key{Scope: "merchant:7", ID: "k1"}
			req := transferReq{Amount: 7, Note: "abandon"}

			ctx, cancel := context.WithCancel(b.ctx)
			wf := newTransfer(b.pool, crashOnceAt(point, cancel))
			e := b.engine(t, fastConfig(wf))
			_, err := wf.Run(ctx, e, key, req, nil)
			require.ErrorIs(t, err, context.Canceled)
			if beforeFirstCommit[point] {
				// The run's row commits with its first step: stopped before that, it left
				// nothing, and the client's retry runs it afresh.
				b.requireNoRun(t, key)
				r, err := wf.Run(b.ctx, e, key, req, nil)
				require.NoError(t, err)
				b.checkTransfer(t, r)
				_, attempts := b.state(t, key)
				require.Equal(t, 1, attempts)
				return
			}
			state, _ := b.state(t, key)
			require.Equal(t, "running", state)

			b.startRiver(t, e)
			require.Equal(t, "done", b.waitFinished(t, key))
			r, err := wf.Run(b.ctx, e, key, req, nil)
			require.NoError(t, err)
			require.Equal(t, 7, r.Amount)
			b.checkTransfer(t, r)
			_, attempts := b.state(t, key)
			require.Equal(t, 2, attempts)
		})
	}
}

// TestRunTakesOverAnExpiredLease: a client's retry resumes a run whose process died, without
// waiting for the recovery scan.
func TestRunTakesOverAnExpiredLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := idem.Key{Scope: "s", ID: "k1"}
	req := transferReq{Amount: 1, Note: "x"}
	ctx, cancel := context.WithCancel(b.ctx)
	wf := newTransfer(b.pool, crashOnceAt("in:charge", cancel))
	e := b.engine(t, fastConfig(wf))
	_, err := wf.Run(ctx, e, key, req, nil)
	require.ErrorIs(t, err, context.Canceled)

	_, err = wf.Run(b.ctx, e, key, req, nil)
	var inflight *idem.InFlightError
	require.ErrorAs(t, err, &inflight, "the lease is still live")

	b.waitLeaseExpired(t, key)
	r, err := wf.Run(b.ctx, e, key, req, nil)
	require.NoError(t, err)
	b.checkTransfer(t, r)
	// The first process was stopped (its context cancelled) after the charge had returned: the
	// charge's checkpoint is kept when a run stops, so the takeover replays it.
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM calls`), "the completed charge was kept, not run again")
}

func TestReconcile(t *testing.T) {
	t.Parallel()

	key := idem.Key{Scope: "s", ID: "k1"}

	// dying returns a workflow whose first attempt dies after its first step.
	dying := func(cancel context.CancelFunc) *workflow.Workflow[int, string] {
		var died atomic.Bool
		return workflow.Define("dying", func(ctx context.Context, in int) (string, error) {
			if _, err := steps.Call(ctx, "first", func(ctx context.Context, key string) (int, error) { return 1, nil }, nil); err != nil {
				return "", err
			}
			if died.CompareAndSwap(false, true) {
				cancel()
				return "", ctx.Err()
			}
			return "finished", nil
		})
	}

	for _, tt := range []struct {
		name      string
		hook      func(calls *atomic.Int32) workflow.ReconcileFunc
		wantState string
		check     func(t *testing.T, out string, err error)
	}{
		{
			name:      "WithoutHookTheRunFails",
			wantState: "failed",
			check: func(t *testing.T, _ string, err error) {
				require.ErrorIs(t, err, workflow.ErrFailed)
				require.ErrorContains(t, err, "given up after 1 attempt")
			},
		},
		{
			name: "HookCompletes",
			hook: func(calls *atomic.Int32) workflow.ReconcileFunc {
				return func(ctx context.Context, run *workflow.StuckRun) (workflow.Decision, error) {
					calls.Add(1)
					if run.Reason != workflow.ReasonMaxAttempts || run.RecoveryPoint != "first" || run.Attempts != 1 {
						return workflow.Decision{}, errors.New("unexpected stuck run")
					}
					return workflow.Complete("settled by ops"), nil
				}
			},
			wantState: "done",
			check: func(t *testing.T, out string, err error) {
				require.NoError(t, err)
				require.Equal(t, "settled by ops", out)
			},
		},
		{
			name: "HookFails",
			hook: func(calls *atomic.Int32) workflow.ReconcileFunc {
				return func(ctx context.Context, run *workflow.StuckRun) (workflow.Decision, error) {
					calls.Add(1)
					return workflow.Fail(errors.New("refunded by support")), nil
				}
			},
			wantState: "failed",
			check: func(t *testing.T, _ string, err error) {
				require.ErrorIs(t, err, workflow.ErrFailed)
				require.ErrorContains(t, err, "refunded by support")
			},
		},
		{
			name: "ZeroDecisionIsRefused",
			hook: func(calls *atomic.Int32) workflow.ReconcileFunc {
				return func(ctx context.Context, run *workflow.StuckRun) (workflow.Decision, error) {
					if calls.Add(1) == 1 {
						return workflow.Decision{}, nil // a hook that forgot to decide
					}
					return workflow.Fail(errors.New("decided the second time")), nil
				}
			},
			wantState: "failed",
			check: func(t *testing.T, _ string, err error) {
				// The zero Decision failed nothing: the run's stored failure is the second one.
				require.ErrorContains(t, err, "decided the second time")
			},
		},
		{
			name: "HookResumesLater",
			hook: func(calls *atomic.Int32) workflow.ReconcileFunc {
				return func(ctx context.Context, run *workflow.StuckRun) (workflow.Decision, error) {
					calls.Add(1)
					return workflow.ResumeLater(0), nil
				}
			},
			wantState: "done",
			check: func(t *testing.T, out string, err error) {
				require.NoError(t, err)
				require.Equal(t, "finished", out)
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx, cancel := context.WithCancel(b.ctx)
			wf := dying(cancel)
			cfg := fastConfig(wf)
			cfg.MaxAttempts = 1
			var calls atomic.Int32
			if tt.hook != nil {
				cfg.Reconcile = tt.hook(&calls)
			}
			e := b.engine(t, cfg)
			_, err := wf.Run(ctx, e, key, 1, nil)
			require.ErrorIs(t, err, context.Canceled)

			b.startRiver(t, e)
			require.Equal(t, tt.wantState, b.waitFinished(t, key))
			if tt.hook != nil && tt.name != "ZeroDecisionIsRefused" {
				require.EqualValues(t, 1, calls.Load())
			}
			out, err := wf.Run(b.ctx, e, key, 1, nil)
			tt.check(t, out, err)
		})
	}

	t.Run("UnregisteredWorkflowAfterGrace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A run of a workflow this deployment does not have, whose process died.
		_, err := b.pool.Exec(b.ctx, `
INSERT INTO idem_keys (scope, id, workflow, expires_at) VALUES ('s', 'ghost', 'ghost', 'infinity');
INSERT INTO idem_runs (scope, id, state, workflow, input, lease_token, lease_expires_at, attempts)
VALUES ('s', 'ghost', 'running', 'ghost', '1', gen_random_uuid(), now() - interval '1 second', 1)`)
		require.NoError(t, err)
		cfg := fastConfig()
		cfg.UnregisteredGrace = 2 * time.Second
		var seen atomic.Pointer[workflow.StuckRun]
		cfg.Reconcile = func(ctx context.Context, run *workflow.StuckRun) (workflow.Decision, error) {
			seen.Store(run)
			return workflow.Fail(errors.New("workflow removed")), nil
		}
		e := b.engine(t, cfg)
		start := time.Now()
		b.startRiver(t, e)
		ghost := idem.Key{Scope: "s", ID: "ghost"}
		require.Equal(t, "failed", b.waitFinished(t, ghost))
		require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "the grace period must be honoured")
		require.Equal(t, workflow.ReasonUnregistered, seen.Load().Reason)
		require.Equal(t, "ghost", seen.Load().Workflow)
	})
}

// TestReaper runs the engine's reap job, idemriver's, through River: it deletes finished, expired
// runs with their steps and keys, and Do's expired keys, and keeps the rest. (idem.Reap itself is
// tested in the root package.)
func TestReaper(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO idem_keys (scope, id, workflow, result, expires_at) VALUES
	('s', 'do-expired', NULL, '1', now() - interval '1 second'),
	('s', 'do-live', NULL, '1', now() + interval '1 hour'),
	('s', 'wf-done-expired', 'w', NULL, 'infinity'),
	('s', 'wf-done-live', 'w', NULL, 'infinity'),
	('s', 'wf-running', 'w', NULL, 'infinity');
INSERT INTO idem_runs (scope, id, workflow, state, output, expires_at, lease_token, lease_expires_at) VALUES
	('s', 'wf-done-expired', 'w', 'done', '1', now() - interval '1 second', NULL, NULL),
	('s', 'wf-done-live', 'w', 'done', '1', now() + interval '1 hour', NULL, NULL),
	('s', 'wf-running', 'w', 'running', NULL, NULL, gen_random_uuid(), now() + interval '1 hour');
INSERT INTO idem_steps (scope, id, seq, name, kind, output) VALUES
	('s', 'wf-done-expired', 1, 'a', 'tx', '1'),
	('s', 'wf-done-live', 1, 'a', 'tx', '1'),
	('s', 'wf-running', 1, 'a', 'tx', '1')`)
	require.NoError(t, err)
	e := b.engine(t, fastConfig())
	b.startRiver(t, e)
	eventually(t, 10*time.Second, "the periodic reaper", func() bool {
		return b.count(t, `SELECT count(*) FROM idem_keys`) == 3
	})
	rows, err := b.pool.Query(b.ctx, `SELECT id FROM idem_keys ORDER BY id`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"do-live", "wf-done-live", "wf-running"}, left)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_runs`))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_steps`), "steps go with their run")
}

// TestStartTx starts runs in the caller's transaction: a committed start runs in the background
// through River, a rolled-back one leaves nothing.
func TestStartTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := newTransfer(b.pool, nil)
	e := b.engine(t, fastConfig(wf))
	b.startRiver(t, e)
	key := idem.Key{Scope: "s", ID: "bg"}
	req := transferReq{Amount: 3, Note: "bg"}

	rolledBack := idem.Key{Scope: "s", ID: "rolled-back"}
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	require.NoError(t, wf.StartTx(b.ctx, e, tx, rolledBack, req))
	require.NoError(t, tx.Rollback(b.ctx))

	for range 2 { // starting twice is starting once
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		require.NoError(t, wf.StartTx(b.ctx, e, tx, key, req))
		require.NoError(t, tx.Commit(b.ctx))
	}
	tx, err = b.pool.Begin(b.ctx)
	require.NoError(t, err)
	require.ErrorIs(t, wf.StartTx(b.ctx, e, tx, key, transferReq{Amount: 4, Note: "bg"}), idem.ErrMismatch)
	require.NoError(t, tx.Rollback(b.ctx))

	require.Equal(t, "done", b.waitFinished(t, key))
	r, err := wf.Run(b.ctx, e, key, req, nil)
	require.NoError(t, err)
	b.checkTransfer(t, r)
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys WHERE id = 'rolled-back'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_resume'`))
}
