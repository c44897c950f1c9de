package workflow_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/workflow"
)

func TestRunCancel(t *testing.T) {
	t.Parallel()
	req := transferReq{Amount: 100, Note: "t"}
	key := idem.Key{Scope: "s", ID: "k1"}

	// The owner is inside settle (a Tx step: its effect is written, its transaction open) when
	// the cancel lands. Its checkpoint fails the fence, so the effect rolls back with it, the
	// owner stops with ErrCancelled, and so does every call with the key afterwards. A resume
	// then finishes the run from its last committed step.
	t.Run("WhileAStepRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		at, release := blockAt("in:settle")
		wf := newTransfer(b.pool, at.hooks)
		var logs syncBuffer
		cfg := fastConfig(wf)
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		e := b.engine(t, cfg)
		done := make(chan error, 1)
		go func() {
			_, err := wf.Run(b.ctx, e, key, req, nil)
			done <- err
		}()
		<-at.reached
		require.NoError(t, e.RunCancel(b.ctx, key, "customer asked"))
		// The owner is still inside settle: a resume now would run beside it.
		e.SetClient(insertOnlyClient(t, b))
		require.ErrorContains(t, e.RunResume(b.ctx, key), "may still be finishing its current step")
		release()
		err := <-done
		var cancelled *workflow.CancelledError
		require.ErrorAs(t, err, &cancelled, "the owner stops as cancelled, not as a lost lease")
		require.ErrorIs(t, err, workflow.ErrCancelled)
		require.Equal(t, "customer asked", cancelled.Reason)
		require.Contains(t, logs.String(), "run was cancelled and stopped")
		require.NotContains(t, logs.String(), "lost its lease", "a cancel is not a takeover")

		require.Equal(t, 1, b.effects(t, "reserve"))
		require.Zero(t, b.effects(t, "settle"), "settle's writes did not commit")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps`), "no checkpoint after the cancel")
		state, _ := b.state(t, key)
		require.Equal(t, "cancelled", state)

		for range 2 {
			_, err = wf.Run(b.ctx, e, key, req, nil)
			require.ErrorIs(t, err, workflow.ErrCancelled)
			_, err = wf.Get(b.ctx, e, key)
			require.ErrorIs(t, err, workflow.ErrCancelled)
		}
		require.Zero(t, b.effects(t, "settle"), "retries ran nothing")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM calls`))

		require.NoError(t, e.RunCancel(b.ctx, key, "again"), "cancelling a cancelled run is a no-op")
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, "customer asked", run.Error)

		b.startRiver(t, e)
		require.NoError(t, e.RunResume(b.ctx, key))
		require.Equal(t, "done", b.waitFinished(t, key))
		r, err := wf.Get(b.ctx, e, key)
		require.NoError(t, err)
		b.checkTransfer(t, r)
		require.Equal(t, 1, b.effects(t, "reserve"), "reserve was replayed, not run again")
	})

	// The owner is inside charge (a Call: its outside effect happens) when the cancel lands.
	// The Call's checkpoint waits for the next transaction, settle's, which fails the fence:
	// neither commits.
	t.Run("WhileACallRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		at, release := blockAt("in:charge")
		wf := newTransfer(b.pool, at.hooks)
		var logs syncBuffer
		cfg := fastConfig(wf)
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		e := b.engine(t, cfg)
		done := make(chan error, 1)
		go func() {
			_, err := wf.Run(b.ctx, e, key, req, nil)
			done <- err
		}()
		<-at.reached
		require.NoError(t, e.RunCancel(b.ctx, key, "stop"))
		release()
		require.ErrorIs(t, <-done, workflow.ErrCancelled)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM calls`), "the call that was under way happened")
		require.Zero(t, b.effects(t, "settle"))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps`), "only reserve, from before the cancel")
		_, err := wf.Run(b.ctx, e, key, req, nil)
		require.ErrorIs(t, err, workflow.ErrCancelled)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM calls`), "the retry ran nothing")
		require.Contains(t, logs.String(), "run was cancelled and stopped")
		require.NotContains(t, logs.String(), "lost its lease", "a cancel is not a takeover")
	})

	// With a DB that is not a pool, a run's transactions are begun with DB.Begin and send each
	// statement on its own; the cancel stops it all the same, with the same history as above.
	t.Run("NotAPool", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := plainDB{b.pool}
		at, release := blockAt("in:settle")
		wf := newTransfer(db, at.hooks)
		e, err := workflow.NewEngine(db, fastConfig(wf))
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := wf.Run(b.ctx, e, key, req, nil)
			done <- err
		}()
		<-at.reached
		require.NoError(t, e.RunCancel(b.ctx, key, "unfolded"))
		release()
		require.ErrorIs(t, <-done, workflow.ErrCancelled)
		require.Zero(t, b.effects(t, "settle"))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps`), "only reserve: charge's checkpoint waited for settle's transaction")
		_, err = wf.Get(b.ctx, e, key)
		require.ErrorIs(t, err, workflow.ErrCancelled)
	})

	// Cancel and resume of one run at once: they take the run's row in turn, so the run ends
	// either cancelled or done (never both, never stuck), and its effects happen at most once.
	t.Run("RacingAResume", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig(wf))
		e.SetClient(insertOnlyClient(t, b))
		require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return wf.StartTx(b.ctx, e, tx, key, req) }))
		var wg sync.WaitGroup
		errs := make([]error, 2)
		start := make(chan struct{})
		wg.Add(2)
		go func() { defer wg.Done(); <-start; errs[0] = e.RunCancel(b.ctx, key, "race") }()
		go func() { defer wg.Done(); <-start; errs[1] = e.RunResume(b.ctx, key) }()
		close(start)
		wg.Wait()
		require.NoError(t, errs[0])
		if errs[1] != nil {
			require.ErrorContains(t, errs[1], "holds its lease", "resume can only lose to an owner")
		}

		b.startRiver(t, e)
		eventually(t, 20*time.Second, "every resume job to finish", func() bool {
			return b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_resume' AND state <> 'completed'`) == 0
		})
		state := b.waitFinished(t, key)
		r, err := wf.Run(b.ctx, e, key, req, nil)
		switch state {
		case "cancelled":
			require.ErrorIs(t, err, workflow.ErrCancelled)
			require.Zero(t, b.effects(t, "settle"))
		case "done":
			require.NoError(t, err)
			b.checkTransfer(t, r)
		default:
			t.Fatalf("run ended %s", state)
		}
		require.LessOrEqual(t, b.effects(t, "reserve"), 1)
	})

	// A run that waits for its resume job has no owner: it is finished as cancelled at once,
	// and the job then finds nothing to do.
	t.Run("WithoutOwner", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig(wf))
		// An insert-only client: StartTx's job waits until River is started below.
		e.SetClient(insertOnlyClient(t, b))
		require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return wf.StartTx(b.ctx, e, tx, key, req) }))
		require.NoError(t, e.RunCancel(b.ctx, key, ""))
		state, _ := b.state(t, key)
		require.Equal(t, "cancelled", state)

		b.startRiver(t, e)
		eventually(t, 20*time.Second, "the resume job to complete", func() bool {
			return b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_resume' AND state = 'completed'`) == 1
		})
		state, _ = b.state(t, key)
		require.Equal(t, "cancelled", state)
		require.Zero(t, b.count(t, `SELECT count(*) FROM effects`))
		_, err := wf.Run(b.ctx, e, key, req, nil)
		var cancelled *workflow.CancelledError
		require.ErrorAs(t, err, &cancelled)
		require.Equal(t, "cancelled by an operator", cancelled.Reason)
	})

	t.Run("FinishedOrMissing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, key, req, nil)
		require.NoError(t, err)
		err = e.RunCancel(b.ctx, key, "")
		require.ErrorContains(t, err, "is done and cannot be cancelled")
		state, _ := b.state(t, key)
		require.Equal(t, "done", state)
		require.ErrorIs(t, e.RunCancel(b.ctx, idem.Key{Scope: "s", ID: "nope"}, ""), idem.ErrNotFound)
	})
}

func TestRunResume(t *testing.T) {
	t.Parallel()
	key := idem.Key{Scope: "s", ID: "k1"}

	// b fails for good; once it is fixed, the resume reruns b and runs c, and replays a.
	t.Run("Failed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fl := newFlaky(b)
		fl.broken.Store(true)
		e := b.engine(t, fastConfig(fl.wf))
		_, err := fl.wf.Run(b.ctx, e, key, 1, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		require.EqualValues(t, 1, fl.runs["a"].Load())
		require.EqualValues(t, 3, fl.runs["b"].Load())

		b.startRiver(t, e)
		require.ErrorContains(t, e.RunResume(b.ctx, idem.Key{Scope: "s", ID: "nope"}), "not found")
		fl.broken.Store(false)
		require.NoError(t, e.RunResume(b.ctx, key))
		require.Equal(t, "done", b.waitFinished(t, key))
		out, err := fl.wf.Get(b.ctx, e, key)
		require.NoError(t, err)
		require.Positive(t, out)
		require.EqualValues(t, 1, fl.runs["a"].Load(), "a was replayed")
		require.EqualValues(t, 4, fl.runs["b"].Load(), "b ran once more")
		require.EqualValues(t, 1, fl.runs["c"].Load())
		for _, s := range []string{"a", "b", "c"} {
			require.Equal(t, 1, b.effects(t, s))
		}
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, 1, run.Attempts, "a fresh budget")
		require.Len(t, run.Steps, 3)

		err = e.RunResume(b.ctx, key)
		require.ErrorContains(t, err, "is done; there is nothing to resume")
	})

	// A run given up after MaxAttempts (dead-lettered by the default reconcile) continues from
	// its last completed step.
	t.Run("DeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(b.ctx)
		wf := newTransfer(b.pool, crashOnceAt("before:settle", cancel))
		cfg := fastConfig(wf)
		cfg.MaxAttempts = 1
		e := b.engine(t, cfg)
		_, err := wf.Run(ctx, e, key, transferReq{Amount: 5, Note: "d"}, nil)
		require.Error(t, err)
		b.startRiver(t, e)
		require.Equal(t, "failed", b.waitFinished(t, key))
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Contains(t, run.Error, "given up")

		require.NoError(t, e.RunResume(b.ctx, key))
		require.Equal(t, "done", b.waitFinished(t, key))
		r, err := wf.Get(b.ctx, e, key)
		require.NoError(t, err)
		b.checkTransfer(t, r)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM calls`), "charge was replayed")
	})

	t.Run("RefusedWhileOwned", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		at, release := blockAt("in:settle")
		wf := newTransfer(b.pool, at.hooks)
		e := b.engine(t, fastConfig(wf))
		e.SetClient(insertOnlyClient(t, b))
		done := make(chan error, 1)
		go func() {
			_, err := wf.Run(b.ctx, e, key, transferReq{Amount: 1, Note: "o"}, nil)
			done <- err
		}()
		<-at.reached
		err := e.RunResume(b.ctx, key)
		release()
		require.ErrorContains(t, err, "holds its lease")
		require.NoError(t, <-done)
		require.Zero(t, b.count(t, `SELECT count(*) FROM river_job`))
	})
}

func TestRunFork(t *testing.T) {
	t.Parallel()
	key := idem.Key{Scope: "s", ID: "k1"}
	forked := idem.Key{Scope: "s", ID: "k1-fork"}
	req := transferReq{Amount: 7, Note: "f"}

	// From step 2: reserve is copied and replayed; charge and settle run again, in a run of
	// their own (so charge gets a new derived key).
	t.Run("FromStep", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig(wf))
		orig, err := wf.Run(b.ctx, e, key, req, nil)
		require.NoError(t, err)
		b.startRiver(t, e)
		// As RunOpts.Timeout would have left it: the fork gets the same timeout.
		_, err = b.pool.Exec(b.ctx, `UPDATE idem_runs SET deadline = created_at + interval '1 hour'`)
		require.NoError(t, err)

		require.NoError(t, e.RunFork(b.ctx, key, forked, 2))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE id = 'k1-fork' AND deadline = created_at + interval '1 hour'`))
		require.Equal(t, "done", b.waitFinished(t, forked))
		r, err := wf.Get(b.ctx, e, forked)
		require.NoError(t, err)
		require.Equal(t, orig.ReserveID, r.ReserveID, "reserve was replayed from the copied history")
		require.NotEqual(t, orig.ChargeKey, r.ChargeKey)
		require.NotEqual(t, orig.SettleID, r.SettleID)
		require.Equal(t, 1, b.effects(t, "reserve"))
		require.Equal(t, 2, b.effects(t, "settle"))
		require.Equal(t, 2, b.count(t, `SELECT count(DISTINCT key) FROM calls`))

		again, err := wf.Run(b.ctx, e, forked, req, nil)
		require.NoError(t, err, "the fork is joined with the same input")
		require.Equal(t, r, again)
		got, err := wf.Get(b.ctx, e, key)
		require.NoError(t, err)
		require.Equal(t, orig, got, "the original is left alone")
		row, err := e.RunGet(b.ctx, forked)
		require.NoError(t, err)
		require.Equal(t, &workflow.ForkRef{Key: key, Steps: 1}, row.ForkedFrom, "the fork records where it came from")
		row, err = e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Nil(t, row.ForkedFrom)

		require.ErrorIs(t, e.RunFork(b.ctx, key, forked, 2), idem.ErrMismatch, "the new key must be unused")
		require.ErrorContains(t, e.RunFork(b.ctx, key, idem.Key{Scope: "s", ID: "k3"}, 5), "fromStep cannot be more than 4")
		require.ErrorContains(t, e.RunFork(b.ctx, key, idem.Key{Scope: "s", ID: "k3"}, 0), "fromStep cannot be less than 1")
		require.ErrorIs(t, e.RunFork(b.ctx, idem.Key{Scope: "s", ID: "nope"}, idem.Key{Scope: "s", ID: "k3"}, 1), idem.ErrNotFound)
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys WHERE id = 'k3'`))
	})
}

// syncBuffer is a bytes.Buffer for a logger that several goroutines write to.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// plainDB hides that a DB is a pool, so that runs write each checkpoint on its own.
type plainDB struct{ *pgxpool.Pool }

// Waiting runs hold no lease: a cancel finishes them at once and their wake-up job finds
// nothing to do; a resume of the cancelled run takes it back to its wait, with its wake-up time.
func TestAdminWaitingRuns(t *testing.T) {
	t.Parallel()
	const hour = 3600 * 1000 // ms, for newSleeper

	t.Run("CancelSleepingThenResume", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newSleeper()
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		key := waitKey("nap")
		_, err := wf.Run(b.ctx, e, key, hour, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		state, _ := b.state(t, key)
		require.Equal(t, "sleeping", state)
		var wakeAt time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT wake_at FROM idem_runs`).Scan(&wakeAt))
		sleeping, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.NotNil(t, sleeping.WakeAt, "RunGet shows when a sleeping run wakes")
		require.True(t, sleeping.WakeAt.Equal(wakeAt))
		require.Empty(t, sleeping.AwaitingSignal)

		err = e.RunResume(b.ctx, key)
		require.ErrorContains(t, err, "is sleeping")
		require.NoError(t, e.RunCancel(b.ctx, key, "no longer needed"))
		_, err = wf.Get(b.ctx, e, key)
		require.ErrorIs(t, err, workflow.ErrCancelled)
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateCancelled, run.State)
		require.Equal(t, "no longer needed", run.Error)

		require.NoError(t, e.RunResume(b.ctx, key))
		eventually(t, 20*time.Second, "the resumed run to sleep again", func() bool {
			state, _ := b.state(t, key)
			return state == "sleeping"
		})
		var again time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT wake_at FROM idem_runs`).Scan(&again))
		require.True(t, again.Equal(wakeAt), "the sleep keeps its wake-up time: %s, was %s", again, wakeAt)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'before'`), "before was replayed")
		require.Zero(t, b.count(t, `SELECT count(*) FROM effects WHERE step = 'after'`))
		_, err = wf.Get(b.ctx, e, key)
		require.ErrorIs(t, err, idem.ErrInFlight)
	})

	t.Run("TimedOutIsFinal", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newSleeper()
		e := b.engine(t, fastConfig(wf))
		e.SetClient(insertOnlyClient(t, b))
		key := waitKey("late")
		_, err := wf.Run(b.ctx, e, key, hour, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		// As the deadline's job leaves it.
		_, err = b.pool.Exec(b.ctx, `UPDATE idem_runs SET state = 'timed_out', output = '{"error": "deadline exceeded"}', finished_at = now(), expires_at = now() + interval '1 hour'`)
		require.NoError(t, err)
		require.ErrorContains(t, e.RunCancel(b.ctx, key, ""), "is timed_out and cannot be cancelled")
		require.ErrorContains(t, e.RunResume(b.ctx, key), "is timed_out")
		_, err = wf.Get(b.ctx, e, key)
		require.ErrorIs(t, err, workflow.ErrDeadlineExceeded)
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateTimedOut, run.State)
		require.True(t, run.State.Finished())
		require.Equal(t, "deadline exceeded", run.Error)
	})
}
