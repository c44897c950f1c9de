package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

func TestKeyWorkflow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "run", workflow: "orders"})
	b.insertDoKey(t, "s", "do", time.Hour)

	wf, ok, err := b.st.KeyWorkflow(b.ctx, b.pool, "s", "run")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "orders", *wf)

	wf, ok, err = b.st.KeyWorkflow(b.ctx, b.pool, "s", "do")
	require.NoError(t, err)
	require.True(t, ok)
	require.Nil(t, wf, "a key of Do's")

	_, ok, err = b.st.KeyWorkflow(b.ctx, b.pool, "s", "missing")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestRunGet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "k", workflow: "orders", state: store.RunAwaiting, attempts: 2, lastError: "late", input: []byte(`1`),
		waitSeq: 3, waitName: "approve", wakeAt: ptr(time.Hour), deadline: ptr(2 * time.Hour)})
	b.insertSignal(t, "s", "k", "approve", `1`)
	b.insertSignal(t, "s", "k", "other", `2`)
	consumed := b.insertSignal(t, "s", "k", "approve", `3`)
	_, err := b.pool.Exec(b.ctx, `UPDATE idem_signals SET consumed_at = now(), consumed_step = 1 WHERE seq = $1`, consumed)
	require.NoError(t, err)

	r, ok, err := b.st.RunGet(b.ctx, b.pool, "s", "k")
	require.NoError(t, err)
	require.True(t, ok)
	got := b.stored(t, "s", "k")
	require.Equal(t, "s", r.Scope)
	require.Equal(t, "k", r.ID)
	require.Equal(t, "orders", r.Workflow)
	require.Equal(t, store.RunAwaiting, r.State)
	require.Equal(t, 2, r.Attempts)
	require.Empty(t, r.LeaseOwner)
	require.Nil(t, r.LeaseExpires)
	require.Equal(t, "late", r.LastError)
	require.Equal(t, []byte(`1`), r.Input)
	require.Nil(t, r.Output)
	require.Equal(t, got.CreatedUS, r.Created.UnixMicro())
	require.False(t, r.Updated.IsZero())
	require.Nil(t, r.Finished)
	require.Nil(t, r.Expires)
	require.Equal(t, *got.WakeAt, r.WakeAt.UnixMicro())
	require.Equal(t, "approve", r.AwaitingSignal)
	require.Equal(t, *got.DeadlineUS, r.Deadline.UnixMicro())
	require.Equal(t, 2, r.PendingSignals)

	// What a waiting run waits for is shown only while it waits.
	b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone, output: []byte(`"out"`), owner: "me", waitSeq: 1, waitName: "x",
		wakeAt: ptr(time.Hour)})
	r, ok, err = b.st.RunGet(b.ctx, b.pool, "s", "done")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "me", r.LeaseOwner)
	require.Equal(t, []byte(`"out"`), r.Output)
	require.NotNil(t, r.Finished)
	require.NotNil(t, r.Expires)
	require.Nil(t, r.WakeAt)
	require.Empty(t, r.AwaitingSignal)
	require.Nil(t, r.Deadline)
	require.Zero(t, r.PendingSignals)

	_, ok, err = b.st.RunGet(b.ctx, b.pool, "s", "missing")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestRunSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "k"})
	b.insertStep(t, "s", "k", 2, "two", "failed")
	b.insertStep(t, "s", "k", 1, "one", "")
	steps, err := b.st.RunSteps(b.ctx, b.pool, "s", "k")
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.Equal(t, store.StepRow{Seq: 1, Name: "one", Kind: "tx", Attempts: 1, Output: []byte(`"out-one"`), Created: steps[0].Created}, steps[0])
	require.Equal(t, store.StepRow{Seq: 2, Name: "two", Kind: "tx", Attempts: 1, Error: ptr("failed"), Created: steps[1].Created}, steps[1])
	require.WithinDuration(t, time.Now(), steps[0].Created, time.Minute)

	n, missing, err := b.st.RunForkCounts(b.ctx, b.pool, "s", "k", 3)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Zero(t, missing)
	n, _, err = b.st.RunForkCounts(b.ctx, b.pool, "s", "missing", 1)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestRunLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "k", workflow: "orders", token: newToken(), owner: "me", lease: time.Minute})
	b.insertRun(t, run{scope: "s", id: "expired", token: newToken(), lease: -time.Minute})

	tx := b.begin(t)
	r, ok, err := b.st.RunLock(b.ctx, tx, "s", "k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, store.LockedRun{State: store.RunRunning, Workflow: "orders", LeaseLive: true, Owner: "me"}, r)
	// The row is held: a checkpoint (here its fence's lock) waits for the admin operation.
	b.requireRunHeld(t, "s", "k")

	r, ok, err = b.st.RunLock(b.ctx, b.pool, "s", "expired")
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, r.LeaseLive)
	require.Empty(t, r.Owner)

	_, ok, err = b.st.RunLock(b.ctx, b.pool, "s", "missing")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestRunCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := newToken()
	b.insertRun(t, run{scope: "s", id: "k", token: tok, owner: "me", lease: time.Minute})
	require.NoError(t, b.st.RunCancel(b.ctx, b.pool, "s", "k", []byte(`{"error":"cancelled"}`), time.Hour))
	got := b.stored(t, "s", "k")
	require.Equal(t, store.RunCancelled, got.State)
	require.Equal(t, []byte(`{"error":"cancelled"}`), got.Output)
	require.True(t, got.Finished)
	within(t, *got.ExpiresIn, 50*time.Minute, time.Hour)
	// The token goes, so the owner's next checkpoint fails its fence; owner and expiry stay, so
	// that no resume starts beside an owner that may still be finishing a step.
	require.False(t, got.Token.Valid)
	require.Equal(t, "me", *got.Owner)
	within(t, *got.LeaseLeft, 50*time.Second, time.Minute)
	_, err := b.st.StepCheckpoint(store.CheckpointParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: tok}, Seq: 1,
		Name: "one", Kind: "tx"}).Exec(b.ctx, b.pool)
	require.True(t, store.IsFenceError(err), "%v", err)
}

func TestRunCancelHeard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "k", token: newToken(), owner: "me", lease: time.Minute})
	require.NoError(t, b.st.RunCancel(b.ctx, b.pool, "s", "k", nil, time.Hour))
	b.insertRun(t, run{scope: "s", id: "running", token: newToken(), owner: "me", lease: time.Minute})

	// Only the owner the cancel left in place gives the lease up, and only of a cancelled run.
	require.NoError(t, b.st.RunCancelHeard(b.ctx, b.pool, "s", "k", "someone else"))
	require.Equal(t, "me", *b.stored(t, "s", "k").Owner)
	require.NoError(t, b.st.RunCancelHeard(b.ctx, b.pool, "s", "running", "me"))
	require.Equal(t, "me", *b.stored(t, "s", "running").Owner)
	require.NotNil(t, b.stored(t, "s", "running").LeaseLeft)

	require.NoError(t, b.st.RunCancelHeard(b.ctx, b.pool, "s", "k", "me"))
	got := b.stored(t, "s", "k")
	require.Nil(t, got.Owner)
	require.Nil(t, got.LeaseLeft)
	require.Equal(t, store.RunCancelled, got.State)
}

func TestRunCutFailed(t *testing.T) {
	t.Parallel()

	t.Run("FromTheFirstFailure", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunFailed, waitSeq: 4, waitName: "go", wakeAt: ptr(time.Hour)})
		b.insertStep(t, "s", "k", 1, "one", "")
		b.insertStep(t, "s", "k", 2, "two", "")
		b.insertStep(t, "s", "k", 3, "three", "boom")
		b.insertStep(t, "s", "k", 4, "four", "")
		b.insertStep(t, "s", "k", 5, "five", "again")
		b.insertStep(t, "s", "other", 3, "x", "boom")
		early := b.insertSignal(t, "s", "k", "go", `1`)
		late := b.insertSignal(t, "s", "k", "go", `2`)
		_, err := b.pool.Exec(b.ctx, `UPDATE idem_signals SET consumed_at = now(), consumed_step = CASE seq WHEN $1 THEN 2 ELSE 4 END
WHERE seq IN ($1, $2)`, early, late)
		require.NoError(t, err)

		cut, err := b.st.RunCutFailed(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.ElementsMatch(t, []int{3, 4, 5}, cut)

		steps, err := b.st.RunSteps(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.Len(t, steps, 2)
		require.Equal(t, 1, b.count(t, "idem_steps", "s", "other"))

		// The signal step 4 consumed is pending again; step 2's stays consumed.
		var pending []int64
		rows, err := b.pool.Query(b.ctx, `SELECT seq FROM idem_signals WHERE consumed_at IS NULL AND consumed_step IS NULL ORDER BY seq`)
		require.NoError(t, err)
		pending, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Equal(t, []int64{late}, pending)

		// The wait step 4 left behind is forgotten, with its timeout.
		got := b.stored(t, "s", "k")
		require.Nil(t, got.WaitSeq)
		require.Nil(t, got.WaitName)
		require.Nil(t, got.WakeAt)
	})

	// A fork that copied a failed step and is resumed runs that step itself: it is not a copy
	// any more.
	t.Run("ForkedSteps", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunFailed})
		b.insertRun(t, run{scope: "s", id: "f", state: store.RunFailed})
		for _, id := range []string{"k", "f"} {
			b.insertStep(t, "s", id, 1, "one", "")
			b.insertStep(t, "s", id, 2, "two", "boom")
		}
		_, err := b.pool.Exec(b.ctx, `UPDATE idem_runs SET forked_scope = 's', forked_id = 'k', forked_steps = 2 WHERE id = 'f'`)
		require.NoError(t, err)
		for _, id := range []string{"k", "f"} {
			cut, err := b.st.RunCutFailed(b.ctx, b.pool, "s", id)
			require.NoError(t, err)
			require.Equal(t, []int{2}, cut)
		}
		rec, _, err := b.st.RunGet(b.ctx, b.pool, "s", "f")
		require.NoError(t, err)
		require.Equal(t, 1, *rec.ForkedSteps)
		rec, _, err = b.st.RunGet(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.Nil(t, rec.ForkedSteps, "a run that was not forked stays so")
	})

	t.Run("EarlierWaitStays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunFailed, waitSeq: 1, waitName: "go", wakeAt: ptr(time.Hour)})
		b.insertStep(t, "s", "k", 1, "wait", "")
		b.insertStep(t, "s", "k", 2, "two", "boom")
		cut, err := b.st.RunCutFailed(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.Equal(t, []int{2}, cut)
		got := b.stored(t, "s", "k")
		require.Equal(t, 1, *got.WaitSeq)
		require.Equal(t, "go", *got.WaitName)
		require.NotNil(t, got.WakeAt)
	})

	t.Run("NoFailure", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunCancelled, waitSeq: 2})
		b.insertStep(t, "s", "k", 1, "one", "")
		b.insertStep(t, "s", "k", 2, "two", "")
		cut, err := b.st.RunCutFailed(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.Empty(t, cut)
		require.Equal(t, 2, b.count(t, "idem_steps", "s", "k"))
		require.Equal(t, 2, *b.stored(t, "s", "k").WaitSeq)
	})
}

func TestRunReopen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "k", state: store.RunFailed, output: []byte(`{"error":"x"}`), attempts: 4, lastError: "x", owner: "me"})
	gen, err := b.st.RunReopen(b.ctx, b.pool, "s", "k")
	require.NoError(t, err)
	got := b.stored(t, "s", "k")
	require.Equal(t, store.RunRunning, got.State)
	require.Nil(t, got.Output)
	require.Zero(t, got.Attempts)
	require.False(t, got.Token.Valid)
	require.Nil(t, got.Owner)
	require.Nil(t, got.LastError)
	require.False(t, got.Finished)
	require.Nil(t, got.ExpiresIn, "a running run never expires")
	require.LessOrEqual(t, *got.LeaseLeft, time.Duration(0), "the resume job takes it at once")
	require.Equal(t, gen, *got.LeaseUS)

	// The reopened run is what the recovery scan finds.
	rows, err := b.st.RunScan(b.ctx, b.pool, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"k"}, scanIDs(rows))

	_, err = b.st.RunReopen(b.ctx, b.pool, "s", "missing")
	require.True(t, errors.Is(err, pgx.ErrNoRows), "%v", err)
}

func TestRunFork(t *testing.T) {
	t.Parallel()

	t.Run("Source", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", workflow: "orders", state: store.RunFailed, fingerprint: []byte{5}, input: []byte(`"in"`),
			trace: "tp", created: -time.Minute, deadline: ptr(time.Hour)})
		b.insertRun(t, run{scope: "s", id: "plain", state: store.RunDone})

		tx := b.begin(t)
		f, ok, err := b.st.RunForkSource(b.ctx, tx, "s", "k")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, store.ForkSource{Workflow: "orders", Fingerprint: []byte{5}, Input: []byte(`"in"`), Trace: "tp",
			Timeout: time.Hour + time.Minute}, f, "the deadline less the creation")
		// The run is held against a change of its history (a cut, a reopen) until the fork ends.
		b.requireRunHeld(t, "s", "k")

		f, ok, err = b.st.RunForkSource(b.ctx, b.pool, "s", "plain")
		require.NoError(t, err)
		require.True(t, ok)
		require.Zero(t, f.Timeout)
		require.Empty(t, f.Trace)

		_, ok, err = b.st.RunForkSource(b.ctx, b.pool, "s", "missing")
		require.NoError(t, err)
		require.False(t, ok)
	})

	t.Run("Steps", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunFailed})
		for i, name := range []string{"one", "two", "three"} {
			b.insertStep(t, "s", "k", i+1, name, "")
		}
		require.NoError(t, b.st.RunForkSteps(b.ctx, b.pool, "s", "k", "t", "fork", 3))
		orig, err := b.st.RunSteps(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		forked, err := b.st.RunSteps(b.ctx, b.pool, "t", "fork")
		require.NoError(t, err)
		require.Equal(t, orig[:2], forked, "the steps before 3, as they were")
		require.Len(t, orig, 3, "the source keeps its own")
	})
}

func TestRunList(t *testing.T) {
	t.Parallel()

	// Six runs created a minute apart, newest last; two share a creation time, which (scope, id)
	// orders.
	fixture := func(t *testing.T) *testBundle {
		b := setup(t)
		for _, r := range []run{
			{scope: "a", id: "1", workflow: "orders", state: store.RunDone, created: -6 * time.Minute},
			{scope: "a", id: "2", workflow: "orders", state: store.RunFailed, created: -5 * time.Minute},
			{scope: "b", id: "1", workflow: "billing", state: store.RunRunning, created: -4 * time.Minute},
			{scope: "a", id: "3", workflow: "billing", state: store.RunSleeping, created: -3 * time.Minute},
			{scope: "b", id: "2", workflow: "orders", state: store.RunFailed, created: -3 * time.Minute},
			{scope: "a", id: "4", workflow: "orders", state: store.RunCancelled, created: -time.Minute},
		} {
			b.insertRun(t, r)
		}
		return b
	}
	list := func(t *testing.T, b *testBundle, f store.RunFilter) []string {
		t.Helper()
		runs, err := b.st.RunList(b.ctx, b.pool, f)
		require.NoError(t, err)
		ids := make([]string, 0, len(runs))
		for _, r := range runs {
			ids = append(ids, r.Scope+"/"+r.ID)
		}
		return ids
	}

	t.Run("Filters", func(t *testing.T) {
		t.Parallel()
		b := fixture(t)
		require.Equal(t, []string{"a/4", "b/2", "a/3", "b/1", "a/2", "a/1"}, list(t, b, store.RunFilter{Limit: 100}), "newest first")
		require.Equal(t, []string{"b/2", "a/2"}, list(t, b, store.RunFilter{States: []string{"failed"}, Limit: 100}))
		require.Equal(t, []string{"a/4", "b/2", "a/2"}, list(t, b, store.RunFilter{States: []string{"failed", "cancelled"}, Limit: 100}))
		require.Equal(t, []string{"a/3", "b/1"}, list(t, b, store.RunFilter{Workflows: []string{"billing"}, Limit: 100}))
		require.Equal(t, []string{"a/4", "a/3", "a/2", "a/1"}, list(t, b, store.RunFilter{Scope: "a", Limit: 100}))
		require.Equal(t, []string{"a/2"}, list(t, b, store.RunFilter{Scope: "a", Workflows: []string{"orders"}, States: []string{"failed"},
			Limit: 100}))

		var created time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT created_at FROM idem_runs WHERE scope = 'b' AND id = '1'`).Scan(&created))
		require.Equal(t, []string{"a/4", "b/2", "a/3", "b/1"}, list(t, b, store.RunFilter{Since: &created, Limit: 100}), "since is inclusive")
		require.Equal(t, []string{"a/2", "a/1"}, list(t, b, store.RunFilter{Until: &created, Limit: 100}), "until is exclusive")
		require.Equal(t, []string{"a/4", "b/2"}, list(t, b, store.RunFilter{Limit: 2}))
		require.Empty(t, list(t, b, store.RunFilter{States: []string{"awaiting"}, Limit: 100}))
	})

	t.Run("ZeroFilterSelectsEverything", func(t *testing.T) {
		t.Parallel()
		// RunFilter's doc: "Zero fields select everything." Limit is one of its fields.
		require.Len(t, list(t, fixture(t), store.RunFilter{}), 6)
	})

	t.Run("Cursor", func(t *testing.T) {
		t.Parallel()
		b := fixture(t)
		var (
			seen  []string
			after *store.RunCursor
		)
		for page := 0; ; page++ {
			runs, err := b.st.RunList(b.ctx, b.pool, store.RunFilter{After: after, Limit: 2})
			require.NoError(t, err)
			if len(runs) == 0 {
				break
			}
			require.Less(t, page, 4)
			for _, r := range runs {
				seen = append(seen, r.Scope+"/"+r.ID)
			}
			last := runs[len(runs)-1]
			after = &store.RunCursor{Created: last.Created.UnixMicro(), Scope: last.Scope, ID: last.ID}
			if page == 0 {
				// Runs added after the first page are newer than the cursor: no page repeats or
				// skips one because of them.
				b.insertRun(t, run{scope: "c", id: "new", created: time.Minute})
			}
		}
		require.Equal(t, []string{"a/4", "b/2", "a/3", "b/1", "a/2", "a/1"}, seen)

		// The cursor between the two runs of one creation time.
		var created time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT created_at FROM idem_runs WHERE scope = 'b' AND id = '2'`).Scan(&created))
		require.Equal(t, []string{"a/3", "b/1"}, list(t, b, store.RunFilter{After: &store.RunCursor{Created: created.UnixMicro(), Scope: "b", ID: "2"},
			Limit: 2}))
	})
}
