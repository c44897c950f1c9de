package workflow_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

func TestRun(t *testing.T) {
	t.Parallel()

	key := func(id string) idem.Key { return idem.Key{Scope: "merchant:7", ID: id} }
	req := transferReq{Amount: 100, Note: "t"}

	t.Run("FirstRunThenReplay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var ran atomic.Int32
		wf := newTransfer(b.pool, &hooks{at: func(_ context.Context, p string) {
			if p == "in:reserve" {
				ran.Add(1)
			}
		}})
		e := b.engine(t, fastConfig(wf))

		replayed := true
		r, err := wf.Run(b.ctx, e, key("k1"), req, &workflow.RunOpts{Replayed: &replayed})
		require.NoError(t, err)
		require.False(t, replayed, "the first call produced the outcome")
		require.Equal(t, 100, r.Amount)
		b.checkTransfer(t, r)

		for range 3 {
			replayed = false
			again, err := wf.Run(b.ctx, e, key("k1"), req, &workflow.RunOpts{Replayed: &replayed})
			require.NoError(t, err)
			require.Equal(t, r, again)
			require.True(t, replayed)
		}
		require.EqualValues(t, 1, ran.Load())
		b.checkTransfer(t, r)
		state, attempts := b.state(t, key("k1"))
		require.Equal(t, "done", state)
		require.Equal(t, 1, attempts)
		require.Equal(t, 3, b.count(t, `SELECT count(*) FROM idem_steps`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs r WHERE lease_token IS NULL AND (SELECT name FROM idem_steps s WHERE s.scope = r.scope AND s.id = r.id ORDER BY seq DESC LIMIT 1) = 'settle'`))
	})

	t.Run("StepKeyIsDocumentedFormat", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig(wf))
		r, err := wf.Run(b.ctx, e, key("k1"), req, nil)
		require.NoError(t, err)
		var created time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT created_at FROM idem_runs`).Scan(&created))
		require.Equal(t, workflow.StepKey(key("k1"), created, 2, "charge"), r.ChargeKey)
		require.NotEqual(t, workflow.StepKey(key("k2"), created, 2, "charge"), r.ChargeKey)
	})

	t.Run("MismatchedInputIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, key("k1"), req, nil)
		require.NoError(t, err)

		_, err = wf.Run(b.ctx, e, key("k1"), transferReq{Amount: 200, Note: "t"}, nil)
		require.ErrorIs(t, err, idem.ErrMismatch)

		// An explicit fingerprint is used instead of the input's digest.
		k := key("k2")
		k.Fingerprint = idem.Fingerprint("a")
		_, err = wf.Run(b.ctx, e, k, req, nil)
		require.NoError(t, err)
		k.Fingerprint = idem.Fingerprint("b")
		_, err = wf.Run(b.ctx, e, k, req, nil)
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM effects WHERE step = 'settle'`))
	})

	t.Run("KeyOfAnotherWorkflowOrOfDoIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		other := workflow.Define("other", func(ctx context.Context, in transferReq) (int, error) { return 1, nil })
		e := b.engine(t, fastConfig(wf, other))

		_, err := idem.Run(b.ctx, b.pool, key("by-do"), func(context.Context, pgx.Tx) (int, error) { return 1, nil })
		require.NoError(t, err)
		_, err = wf.Run(b.ctx, e, key("by-do"), req, nil)
		require.ErrorIs(t, err, idem.ErrMismatch)

		_, err = wf.Run(b.ctx, e, key("k1"), req, nil)
		require.NoError(t, err)
		_, err = other.Run(b.ctx, e, key("k1"), req, nil)
		require.ErrorIs(t, err, idem.ErrMismatch)

		_, err = idem.Run(b.ctx, b.pool, key("k1"), func(context.Context, pgx.Tx) (int, error) { return 1, nil })
		require.ErrorIs(t, err, idem.ErrMismatch)
	})

	t.Run("InvalidKeyAndUnregisteredWorkflow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig())
		_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "has space"}, req, nil)
		require.ErrorIs(t, err, idem.ErrInvalidKey)
		_, err = wf.Run(b.ctx, e, key("k1"), req, nil)
		require.ErrorContains(t, err, `"transfer" is not registered with this engine`)
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys`))
	})

	t.Run("ConcurrentStartsMakeOneRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 8
		var ran, returned atomic.Int32
		othersDone := make(chan struct{})
		// Every caller runs the workflow's code up to its first step; the first step's
		// transaction writes the run's row, and only one caller's can.
		wf := newTransfer(b.pool, &hooks{at: func(_ context.Context, p string) {
			if p == "in:reserve" {
				ran.Add(1)
				<-othersDone // keep the run in flight until every other caller has had its answer
			}
		}})
		e := b.engine(t, fastConfig(wf))

		var wg sync.WaitGroup
		results := make([]error, n)
		receipts := make([]receipt, n)
		for i := range n {
			wg.Go(func() {
				receipts[i], results[i] = wf.Run(b.ctx, e, key("k1"), req, nil)
				if returned.Add(1) == n-1 {
					close(othersDone)
				}
			})
		}
		wg.Wait()
		ok := 0
		for i, err := range results {
			if err == nil {
				ok++
				b.checkTransfer(t, receipts[i])
				continue
			}
			var inflight *idem.InFlightError
			require.ErrorAs(t, err, &inflight)
			require.GreaterOrEqual(t, inflight.RetryAfter, time.Second)
		}
		require.Equal(t, 1, ok)
		require.EqualValues(t, 1, ran.Load())
	})

	t.Run("WaitReplaysTheRunInFlight", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var ran atomic.Int32
		wf := newTransfer(b.pool, &hooks{at: func(_ context.Context, p string) {
			if p == "in:reserve" {
				ran.Add(1)
				time.Sleep(300 * time.Millisecond)
			}
		}})
		e := b.engine(t, fastConfig(wf))

		const n = 6
		var wg sync.WaitGroup
		receipts := make([]receipt, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				receipts[i], errs[i] = wf.Run(b.ctx, e, key("k1"), req, &workflow.RunOpts{Wait: 10 * time.Second})
			})
		}
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i])
			require.Equal(t, receipts[0], receipts[i])
		}
		require.EqualValues(t, 1, ran.Load())
		b.checkTransfer(t, receipts[0])
	})

	t.Run("FailureIsStoredAndReplayed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var ran atomic.Int32
		wf := workflow.Define("fails", func(ctx context.Context, in int) (int, error) {
			if _, err := steps.Tx(ctx, "write", func(ctx context.Context, tx pgx.Tx) (int, error) {
				ran.Add(1)
				_, err := tx.Exec(ctx, `INSERT INTO effects (run, step) VALUES ('f', 'write')`)
				return 0, err
			}, nil); err != nil {
				return 0, err
			}
			return 0, errBoom
		})
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, key("k1"), 1, nil)
		var failed *workflow.FailedError
		require.ErrorAs(t, err, &failed)
		require.ErrorIs(t, err, workflow.ErrFailed)
		require.Equal(t, "boom", failed.Message)
		first := err.Error()

		_, err = wf.Run(b.ctx, e, key("k1"), 1, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		require.Equal(t, first, err.Error())
		require.EqualValues(t, 1, ran.Load())
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
		state, _ := b.state(t, key("k1"))
		require.Equal(t, "failed", state)
	})

	t.Run("TransientStepErrorsAreRetriedWithTheSameKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var keys []string
		wf := workflow.Define("flaky", func(ctx context.Context, in int) (string, error) {
			return steps.Call(ctx, "charge", func(ctx context.Context, key string) (string, error) {
				keys = append(keys, key)
				if len(keys) < 3 {
					return "", errBoom
				}
				return "charged", nil
			}, &steps.Opts{MaxAttempts: 3, MinBackoff: time.Millisecond})
		})
		e := b.engine(t, fastConfig(wf))
		out, err := wf.Run(b.ctx, e, key("k1"), 1, nil)
		require.NoError(t, err)
		require.Equal(t, "charged", out)
		require.Len(t, keys, 3)
		require.Equal(t, keys[0], keys[1])
		require.Equal(t, keys[0], keys[2])
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps WHERE attempts = 3`))
	})

	t.Run("FinalStepErrorIsStoredAndEndsTheRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var calls atomic.Int32
		wf := workflow.Define("declined", func(ctx context.Context, in int) (string, error) {
			_, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (string, error) {
				calls.Add(1)
				return "", steps.Permanent(errors.New("card declined"))
			}, &steps.Opts{MaxAttempts: 5, MinBackoff: time.Millisecond})
			var stepErr *workflow.StepError
			require.ErrorAs(t, err, &stepErr)
			require.Equal(t, 1, stepErr.Attempts)
			return "", err
		})
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, key("k1"), 1, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		require.ErrorContains(t, err, "card declined")
		require.EqualValues(t, 1, calls.Load())
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps WHERE error LIKE '%card declined%'`))
	})

	t.Run("StepOutsideAWorkflowIsAnError", func(t *testing.T) {
		t.Parallel()
		_, err := steps.Call(context.Background(), "x", func(context.Context, string) (int, error) { return 1, nil }, nil)
		require.ErrorContains(t, err, "outside a workflow")
	})

	t.Run("ConcurrentStepsStopTheRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := workflow.Define("parallel", func(ctx context.Context, in int) (int, error) {
			entered, release := make(chan struct{}), make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				_, _ = steps.Call(ctx, "a", func(ctx context.Context, key string) (int, error) {
					close(entered)
					<-release
					return 1, nil
				}, nil)
			})
			<-entered // step "a" is running; "b" now overlaps it
			_, err := steps.Call(ctx, "b", func(ctx context.Context, key string) (int, error) { return 2, nil }, nil)
			close(release)
			wg.Wait()
			return 0, err
		})
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, key("k1"), 1, nil)
		require.ErrorContains(t, err, "must be called one at a time")
		state, _ := b.state(t, key("k1"))
		require.Equal(t, "running", state, "a bug in the code must not fail the run for good")
	})

	t.Run("PanicStopsTheRunWithoutFailingIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := workflow.Define("panics", func(ctx context.Context, in int) (int, error) {
			if _, err := steps.Call(ctx, "a", func(ctx context.Context, key string) (int, error) { return 1, nil }, nil); err != nil {
				return 0, err
			}
			panic("nil map")
		})
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, key("k1"), 1, nil)
		require.ErrorContains(t, err, `workflow "panics" panicked: nil map`)
		require.NotErrorIs(t, err, workflow.ErrFailed)
		state, _ := b.state(t, key("k1"))
		require.Equal(t, "running", state)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE last_error LIKE '%panicked: nil map%'`))
	})

	t.Run("HeartbeatKeepsALongStepsLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		inStep, release := make(chan struct{}), make(chan struct{})
		wf := workflow.Define("slow", func(ctx context.Context, in int) (string, error) {
			return steps.Call(ctx, "slow", func(ctx context.Context, key string) (string, error) {
				close(inStep)
				<-release // a step longer than its lease
				return "done", nil
			}, nil)
		})
		e := b.engine(t, fastConfig(wf))
		done := make(chan error, 1)
		go func() {
			_, err := wf.Run(b.ctx, e, key("k1"), 1, nil)
			done <- err
		}()
		<-inStep
		// Wait, by the database's clock, until the lease the run started with has run out:
		// only the heartbeat's renewals keep the run owned now.
		var first time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT lease_expires_at FROM idem_runs`).Scan(&first))
		eventually(t, 10*time.Second, "the first lease to run out", func() bool {
			var past bool
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT now() > $1`, first).Scan(&past))
			return past
		})
		_, err := wf.Run(b.ctx, e, key("k1"), 1, nil)
		require.ErrorIs(t, err, idem.ErrInFlight, "a renewed lease must keep others out")
		close(release)
		require.NoError(t, <-done)
		state, attempts := b.state(t, key("k1"))
		require.Equal(t, "done", state)
		require.Equal(t, 1, attempts)
	})

	t.Run("EnqueueInsertsTheJobOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var ctxCancel context.CancelFunc
		var crashed atomic.Bool
		wf := workflow.Define("notify", func(ctx context.Context, in int) (int, error) {
			if err := steps.Enqueue(ctx, "notify", notifyArgs{Run: "n"}, nil, nil); err != nil {
				return 0, err
			}
			// The process dies in the next step, once the enqueue has committed.
			return steps.Call(ctx, "after", func(ctx context.Context, _ string) (int, error) {
				if crashed.CompareAndSwap(false, true) {
					ctxCancel()
					return 0, ctx.Err()
				}
				return 1, nil
			}, nil)
		})
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		ctx, cancel := context.WithCancel(b.ctx)
		ctxCancel = cancel
		_, err := wf.Run(ctx, e, key("k1"), 1, nil)
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, "done", b.waitFinished(t, key("k1")))
		out, err := wf.Run(b.ctx, e, key("k1"), 1, nil)
		require.NoError(t, err)
		require.Equal(t, 1, out)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'test_notify'`))
	})
}

// TestStaleWorkerCannotCommit plays a process that is paused mid-step (its lease renewals stop)
// while another takes the run over. When the paused one wakes up, while the new owner is still
// at work, its step's transaction is refused by the fence and rolls back; the new owner
// finishes the run. The step is the run's last: the run exists (and has a lease to lose) once
// its first step has committed.
func TestStaleWorkerCannotCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := idem.Key{Scope: "s", ID: "k1"}
	req := transferReq{Amount: 5, Note: "t"}

	staleInStep, releaseStale := make(chan struct{}), make(chan struct{})
	stale := newTransfer(b.pool, &hooks{at: func(_ context.Context, p string) {
		if p == "in:settle" {
			close(staleInStep)
			<-releaseStale
		}
	}})
	staleEngine := b.engine(t, fastConfig(stale))
	workflow.PauseHeartbeat(staleEngine)

	// The fresh worker owns the run once it reaches the charge: its first pass found the key
	// taken at the reserve, looked it up and took the expired lease over.
	freshOwns, releaseFresh := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fresh := newTransfer(b.pool, &hooks{at: func(_ context.Context, p string) {
		if p == "before:charge" {
			once.Do(func() {
				close(freshOwns)
				<-releaseFresh
			})
		}
	}})
	freshEngine := b.engine(t, fastConfig(fresh))

	staleDone := make(chan error, 1)
	go func() {
		_, err := stale.Run(b.ctx, staleEngine, key, req, nil)
		staleDone <- err
	}()
	<-staleInStep // the stale worker has written its effect, not yet committed
	b.waitLeaseExpired(t, key)

	type result struct {
		r   receipt
		err error
	}
	freshDone := make(chan result, 1)
	go func() {
		r, err := fresh.Run(b.ctx, freshEngine, key, req, nil)
		freshDone <- result{r, err}
	}()
	<-freshOwns // the new owner holds the lease and is about to run the same step

	close(releaseStale)
	err := <-staleDone
	require.ErrorIs(t, err, workflow.ErrLeaseLost)
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects WHERE step = 'settle'`), "the stale worker's write must roll back")

	close(releaseFresh)
	res := <-freshDone
	require.NoError(t, res.err)
	b.checkTransfer(t, res.r)
	state, attempts := b.state(t, key)
	require.Equal(t, "done", state)
	require.Equal(t, 2, attempts)
}

// TestNonDeterminism runs a workflow to the middle, then "deploys" code that calls other steps
// (or fewer), and checks that the resumed run stops with a clear error and changes nothing.
func TestNonDeterminism(t *testing.T) {
	t.Parallel()

	v1 := func(cancel context.CancelFunc) func(ctx context.Context, in int) (int, error) {
		return func(ctx context.Context, in int) (int, error) {
			if _, err := steps.Tx(ctx, "a", func(ctx context.Context, tx pgx.Tx) (int, error) {
				_, err := tx.Exec(ctx, `INSERT INTO effects (run, step) VALUES ('nd', 'a')`)
				return 1, err
			}, nil); err != nil {
				return 0, err
			}
			if _, err := steps.Call(ctx, "b", func(ctx context.Context, key string) (int, error) { return 2, nil }, nil); err != nil {
				return 0, err
			}
			cancel() // the process dies before step c
			return 0, ctx.Err()
		}
	}

	for _, tt := range []struct {
		name string
		v2   func(ctx context.Context, in int) (int, error)
		want workflow.Divergence
	}{
		{
			name: "StepChanged",
			v2: func(ctx context.Context, in int) (int, error) {
				if _, err := steps.Tx(ctx, "a", func(ctx context.Context, tx pgx.Tx) (int, error) { return 0, errors.New("must not run") }, nil); err != nil {
					return 0, err
				}
				_, err := steps.Call(ctx, "refund", func(ctx context.Context, key string) (int, error) { return 0, errors.New("must not run") }, nil)
				return 0, err
			},
			want: workflow.Divergence{Seq: 2, StoredKind: "call", StoredName: "b", CalledKind: "call", CalledName: "refund"},
		},
		{
			name: "StepRemoved",
			v2: func(ctx context.Context, in int) (int, error) {
				_, err := steps.Tx(ctx, "a", func(ctx context.Context, tx pgx.Tx) (int, error) { return 0, errors.New("must not run") }, nil)
				return 3, err
			},
			want: workflow.Divergence{Seq: 2, StoredKind: "call", StoredName: "b"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			key := idem.Key{Scope: "s", ID: "k1"}
			ctx, cancel := context.WithCancel(b.ctx)
			old := workflow.Define("nd", v1(cancel))
			_, err := old.Run(ctx, b.engine(t, fastConfig(old)), key, 1, nil)
			require.ErrorIs(t, err, context.Canceled)
			b.waitLeaseExpired(t, key)

			// The run fails at once, no retries: they cannot make the code match.
			changed := workflow.Define("nd", tt.v2)
			e := b.engine(t, fastConfig(changed))
			_, err = changed.Run(b.ctx, e, key, 1, nil)
			var failed *workflow.FailedError
			require.ErrorAs(t, err, &failed)
			require.ErrorIs(t, err, workflow.ErrNonDeterminism)
			require.ErrorIs(t, err, workflow.ErrFailed)
			require.Equal(t, workflow.FailureNondeterministic, failed.Reason)
			require.Equal(t, tt.want, *failed.Divergence)
			require.Contains(t, failed.Message, "workflow.Patched")
			require.Contains(t, failed.Message, "RunFork")

			state, attempts := b.state(t, key)
			require.Equal(t, "failed", state)
			require.Equal(t, 2, attempts, "the first and the one that diverged")
			require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_steps`), "the history stays")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))

			run, err := e.RunGet(b.ctx, key)
			require.NoError(t, err)
			require.Equal(t, workflow.FailureNondeterministic, run.Reason)
			require.Equal(t, tt.want, *run.Divergence)
			require.Equal(t, failed.Message, run.Error)
			_, err = changed.Run(b.ctx, e, key, 1, nil)
			require.ErrorIs(t, err, workflow.ErrNonDeterminism, "every retry gets the stored failure")
		})
	}
}

func TestNewEngine(t *testing.T) {
	t.Parallel()
	wf := workflow.Define("w", func(ctx context.Context, in int) (int, error) { return in, nil })

	for _, tt := range []struct {
		cfg  workflow.Config
		want string
	}{
		{workflow.Config{Lease: 500 * time.Millisecond}, "Lease cannot be less than 1s"},
		{workflow.Config{ScanInterval: time.Millisecond}, "ScanInterval cannot be less than 1s"},
		{workflow.Config{MaxAttempts: -1}, "MaxAttempts cannot be negative"},
		{workflow.Config{Workflows: []workflow.Definition{wf, wf}}, `Workflows has "w" twice`},
		{workflow.Config{Workflows: []workflow.Definition{nil}}, "Workflows[0] cannot be nil"},
	} {
		_, err := workflow.NewEngine(pgxpoolPlaceholder{}, &tt.cfg)
		require.ErrorContains(t, err, tt.want)
	}
	_, err := workflow.NewEngine(nil, nil)
	require.ErrorContains(t, err, "db cannot be nil")
	e, err := workflow.NewEngine(pgxpoolPlaceholder{}, nil)
	require.NoError(t, err)
	require.Len(t, e.PeriodicJobs(), 2)
}

// pgxpoolPlaceholder is a DB that is never used: NewEngine does not touch the database.
type pgxpoolPlaceholder struct{ workflow.DB }

// TestSchema runs a workflow with idem's tables in a schema of their own.
func TestSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, idem.Migrate(b.ctx, b.pool, idem.Schema("billing")))
	wf := newTransfer(b.pool, nil)
	cfg := fastConfig(wf)
	cfg.Schema = "billing"
	e := b.engine(t, cfg)
	b.startRiver(t, e)
	key := idem.Key{Scope: "s", ID: "k1"}
	r, err := wf.Run(b.ctx, e, key, transferReq{Amount: 1, Note: "x"}, nil)
	require.NoError(t, err)
	b.checkTransfer(t, r)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	require.NoError(t, wf.StartTx(b.ctx, e, tx, key, transferReq{Amount: 1, Note: "x"}))
	require.NoError(t, tx.Commit(b.ctx))

	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM billing.idem_steps`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM public.idem_keys`))
	_, err = workflow.Reap(b.ctx, e)
	require.NoError(t, err)
}
