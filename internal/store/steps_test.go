package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

func TestStepCheckpoint(t *testing.T) {
	t.Parallel()

	t.Run("HoldsLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		lease := store.LeaseParams{Scope: "s", ID: "k", Token: tok}
		failure := "card declined"
		tx := b.begin(t)
		_, err := b.st.StepCheckpoint(store.CheckpointParams{LeaseParams: lease, Seq: 1, Name: "charge", Kind: "call", Output: []byte(`{"id":1}`),
			Attempts: 3}).Exec(b.ctx, tx)
		require.NoError(t, err)

		// The fence holds the run's row until COMMIT: a takeover or a cancel waits for the step.
		b.requireRunHeld(t, "s", "k")

		_, err = b.st.StepCheckpoint(store.CheckpointParams{LeaseParams: lease, Seq: 2, Name: "ship", Kind: "tx", Error: &failure,
			Attempts: 1}).Exec(b.ctx, tx)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(b.ctx))

		hist, err := b.st.RunHistory(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.Equal(t, []store.StepRecord{
			{Seq: 1, Name: "charge", Kind: "call", Output: []byte(`{"id":1}`), Attempts: 3},
			{Seq: 2, Name: "ship", Kind: "tx", Error: &failure, Attempts: 1},
		}, hist)
	})

	t.Run("FenceAbortsTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		b.insertRun(t, run{scope: "s", id: "cancelled", state: store.RunCancelled, token: tok})
		b.insertRun(t, run{scope: "s", id: "sleeping", state: store.RunSleeping, token: tok})
		_, err := b.pool.Exec(b.ctx, `CREATE TABLE effects (n int)`)
		require.NoError(t, err)
		for _, p := range []store.LeaseParams{
			{Scope: "s", ID: "k", Token: newToken()}, // the lease was taken over
			{Scope: "s", ID: "cancelled", Token: tok},
			{Scope: "s", ID: "sleeping", Token: tok},
			{Scope: "s", ID: "missing", Token: tok},
			{Scope: "s", ID: "k"}, // no token
		} {
			tx := b.begin(t)
			_, err := tx.Exec(b.ctx, `INSERT INTO effects VALUES (1)`) // the step's own write
			require.NoError(t, err)
			_, err = b.st.StepCheckpoint(store.CheckpointParams{LeaseParams: p, Seq: 1, Name: "one", Kind: "tx"}).Exec(b.ctx, tx)
			require.True(t, store.IsFenceError(err), "%s: %v", p.ID, err)
			require.False(t, store.IsFinishFenceError(err))
			require.Error(t, tx.Commit(b.ctx))
		}
		var effects int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM effects) + (SELECT count(*) FROM idem_steps)`).Scan(&effects))
		require.Zero(t, effects)
	})

	t.Run("SameSeqTwice", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		b.insertStep(t, "s", "k", 1, "one", "")
		_, err := b.st.StepCheckpoint(store.CheckpointParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: tok}, Seq: 1,
			Name: "one", Kind: "tx"}).Exec(b.ctx, b.pool)
		require.Error(t, err, "a step is written once")
		require.False(t, store.IsFenceError(err), "a duplicate step is not a lost lease: %v", err)
	})
}

func TestStepCheckpointInFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := newToken()
	b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
	lease := store.LeaseParams{Scope: "s", ID: "k", Token: tok}
	tx := b.begin(t)
	// Another statement of the transaction fences (here WaitLock); this one takes no lock of its
	// own, so it does not look at the run.
	_, ok, err := b.st.WaitLock(b.ctx, tx, lease)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = b.st.StepCheckpointInFenced(store.CheckpointParams{LeaseParams: lease, Seq: 1, Name: "one", Kind: "sleep",
		Output: []byte(`null`), Attempts: 1}).Exec(b.ctx, tx)
	require.NoError(t, err)
	// Without a token it writes nothing.
	tag, err := b.st.StepCheckpointInFenced(store.CheckpointParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k"}, Seq: 2,
		Name: "two", Kind: "tx"}).Exec(b.ctx, tx)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected())
	require.NoError(t, tx.Commit(b.ctx))

	n, _, err := b.st.RunForkCounts(b.ctx, b.pool, "s", "k", 1)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	steps, err := b.st.RunSteps(b.ctx, b.pool, "s", "k")
	require.NoError(t, err)
	require.Equal(t, "sleep", steps[0].Kind)
}

func TestIsFenceError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A NOT NULL failure on another column or table is not the fence.
	_, err := b.pool.Exec(b.ctx, `INSERT INTO idem_steps (scope, id, seq, name, kind) VALUES ('s', 'k', 1, NULL, 'tx')`)
	require.Error(t, err)
	require.False(t, store.IsFenceError(err))
	_, err = b.pool.Exec(b.ctx, `INSERT INTO idem_runs (scope, id, workflow, state) VALUES (NULL, 'k', 'wf', 'running')`)
	require.Error(t, err)
	require.False(t, store.IsFenceError(err))
	require.False(t, store.IsFenceError(nil))
}

func TestRunHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "k"})
	b.insertStep(t, "s", "k", 3, "three", "")
	b.insertStep(t, "s", "k", 1, "one", "")
	b.insertStep(t, "s", "k", 2, "two", "failed")
	b.insertStep(t, "s", "other", 1, "x", "")

	hist, err := b.st.RunHistory(b.ctx, b.pool, "s", "k")
	require.NoError(t, err)
	require.Equal(t, []store.StepRecord{
		{Seq: 1, Name: "one", Kind: "tx", Output: []byte(`"out-one"`), Attempts: 1},
		{Seq: 2, Name: "two", Kind: "tx", Error: ptr("failed"), Attempts: 1},
		{Seq: 3, Name: "three", Kind: "tx", Output: []byte(`"out-three"`), Attempts: 1},
	}, hist)

	hist, err = b.st.RunHistory(b.ctx, b.pool, "s", "missing")
	require.NoError(t, err)
	require.Empty(t, hist)
}

func TestStepAttempt(t *testing.T) {
	t.Parallel()

	t.Run("TrimsToKeepPerStep", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		add := func(seq, n, keep int, outcome store.AttemptOutcome) {
			t.Helper()
			_, err := b.st.StepAttempt(store.AttemptParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: tok}, Seq: seq,
				Name: fmt.Sprint("step-", seq), Kind: "call", Attempt: n, Outcome: outcome, Error: fmt.Sprint("error ", n), Keep: keep}).Exec(b.ctx, b.pool)
			require.NoError(t, err)
		}
		add(1, 1, 3, store.AttemptRetried)
		add(1, 2, 3, store.AttemptRetried)
		for n := 1; n <= 5; n++ {
			add(2, n, 3, store.AttemptRetried)
		}
		add(2, 6, 3, store.AttemptFailed)

		rows, err := b.st.RunAttempts(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		var got []string
		for _, r := range rows {
			got = append(got, fmt.Sprintf("%d/%d/%s/%s", r.Seq, r.Attempt, r.Outcome, r.Error))
			require.Equal(t, fmt.Sprint("step-", r.Seq), r.Name)
			require.Equal(t, "call", r.Kind)
			require.WithinDuration(t, time.Now(), r.At, time.Minute)
		}
		// The newest 3 of step 2, oldest first; step 1's are its own.
		require.Equal(t, []string{"1/1/retried/error 1", "1/2/retried/error 2", "2/4/retried/error 4", "2/5/retried/error 5",
			"2/6/failed/error 6"}, got)
	})

	t.Run("KeepAtLeastOne", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		for n := 1; n <= 3; n++ {
			_, err := b.st.StepAttempt(store.AttemptParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: tok}, Seq: 1,
				Name: "one", Kind: "tx", Attempt: n, Outcome: store.AttemptStopped, Error: fmt.Sprint(n), Keep: 0}).Exec(b.ctx, b.pool)
			require.NoError(t, err)
		}
		rows, err := b.st.RunAttempts(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, 3, rows[0].Attempt)
		require.Equal(t, store.AttemptStopped, rows[0].Outcome)
	})

	t.Run("NotTheLeaseHolder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		b.insertHistory(t, "s", "k") // one attempt of step 1
		for _, p := range []store.LeaseParams{{Scope: "s", ID: "k", Token: newToken()}, {Scope: "s", ID: "k"}, {Scope: "s", ID: "missing", Token: tok}} {
			// Keep 1 would trim the stored attempt, if this one were written.
			_, err := b.st.StepAttempt(store.AttemptParams{LeaseParams: p, Seq: 1, Name: "one", Kind: "tx", Attempt: 9,
				Outcome: store.AttemptPermanent, Error: "late", Keep: 1}).Exec(b.ctx, b.pool)
			require.NoError(t, err)
		}
		rows, err := b.st.RunAttempts(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, "boom", rows[0].Error)
		require.Equal(t, 0, b.count(t, "idem_step_attempts", "s", "missing"))
	})
}
