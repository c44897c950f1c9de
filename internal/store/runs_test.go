package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// start sends RunStart on q and reads its row.
func (b *testBundle) start(t *testing.T, q store.Querier, p store.RunStartParams) store.RunStartRow {
	t.Helper()
	s := b.st.RunStart(p)
	row, err := store.ScanRunStart(q.QueryRow(b.ctx, s.SQL, s.Args...))
	require.NoError(t, err)
	return row
}

// requireInFlight requires a start of s/id to find the key in flight: answered at once (a
// lock_timeout fails a statement that waits for a lock), neither locked nor started.
func (b *testBundle) requireInFlight(t *testing.T, id string) store.RunStartRow {
	t.Helper()
	tx := b.lockedElsewhere(t)
	s := b.st.RunStart(startParams("s", id))
	row, err := store.ScanRunStart(tx.QueryRow(b.ctx, s.SQL, s.Args...))
	require.NoError(t, err, "%s: the start waited for the one in flight", id)
	require.False(t, row.Locked, id)
	require.False(t, row.Started, id)
	require.NoError(t, tx.Commit(b.ctx))
	return row
}

func startParams(scope, id string) store.RunStartParams {
	return store.RunStartParams{Scope: scope, ID: id, Fingerprint: []byte{1, 2}, Workflow: "wf", Input: []byte(`{"n":1}`),
		Token: newToken(), Owner: "owner-1", Lease: time.Minute, Trace: "00-trace-01", Timeout: time.Hour}
}

func TestRunStart(t *testing.T) {
	t.Parallel()

	t.Run("FreeKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := startParams("s", "k")
		tx := b.begin(t)
		row := b.start(t, tx, p)
		require.True(t, row.Locked)
		require.True(t, row.Started)
		// The key and run as they were before the statement: none.
		require.False(t, row.KeyRun.Found)
		require.Nil(t, row.KeyRun.State)
		require.NoError(t, tx.Commit(b.ctx))

		got := b.stored(t, "s", "k")
		require.Equal(t, row.Created, got.CreatedUS)
		require.Equal(t, store.RunRunning, got.State)
		require.Equal(t, "wf", got.Workflow)
		require.Equal(t, p.Fingerprint, got.Fingerprint)
		require.Equal(t, p.Input, got.Input)
		require.Equal(t, 1, got.Attempts)
		require.Equal(t, p.Token, got.Token)
		require.Equal(t, "owner-1", *got.Owner)
		within(t, *got.LeaseLeft, 50*time.Second, time.Minute)
		require.Equal(t, "00-trace-01", *got.TraceContext)
		require.Equal(t, row.Created+time.Hour.Microseconds(), *got.DeadlineUS)
		require.Nil(t, got.ExpiresIn)

		var workflow string
		var infinite bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT workflow, expires_at = 'infinity' FROM idem_keys WHERE scope = 's' AND id = 'k'`).
			Scan(&workflow, &infinite))
		require.Equal(t, "wf", workflow)
		require.True(t, infinite, "a run's key expires with its run, never by itself")
	})

	t.Run("NoTimeoutNoTrace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := startParams("s", "k")
		p.Timeout, p.Trace = 0, ""
		require.True(t, b.start(t, b.pool, p).Started)
		got := b.stored(t, "s", "k")
		require.Nil(t, got.DeadlineUS)
		require.Nil(t, got.TraceContext)
	})

	t.Run("LockHeldElsewhere", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		other := b.begin(t)
		_, err := other.Exec(b.ctx, `SELECT pg_advisory_xact_lock($1)`, store.LockID("", "s", "k"))
		require.NoError(t, err)

		require.False(t, b.requireInFlight(t, "k").KeyRun.Found)
		require.NoError(t, other.Rollback(b.ctx))
		require.Equal(t, 0, b.count(t, "idem_keys", "s", "k"))
		require.Equal(t, 0, b.count(t, "idem_runs", "s", "k"))
	})

	t.Run("DuplicateOfAnUncommittedStart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.begin(t)
		require.True(t, b.start(t, first, startParams("s", "k")).Started)

		// The duplicate neither waits on the first's uncommitted key (the unique index would park
		// it until the first ends) nor inserts anything.
		require.False(t, b.requireInFlight(t, "k").KeyRun.Found)
		require.NoError(t, first.Commit(b.ctx))
		require.Equal(t, 1, b.count(t, "idem_runs", "s", "k"))
	})

	t.Run("DuplicateOfAnUncommittedEnqueue", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// StartTx's run, in a transaction of the caller's that has not committed yet; then its
		// other path, an expired key taken over by RunReplace.
		b.insertRun(t, run{scope: "s", id: "expired", state: store.RunDone, expires: -time.Second})
		enqueue := b.begin(t)
		_, ok, err := b.st.RunEnqueue(b.ctx, enqueue, store.RunEnqueueParams{Scope: "s", ID: "fresh", Workflow: "wf"})
		require.NoError(t, err)
		require.True(t, ok)
		_, ok, err = b.st.RunReplace(b.ctx, enqueue, store.RunReplaceParams{RunStartParams: store.RunStartParams{Scope: "s", ID: "expired",
			Workflow: "wf"}})
		require.NoError(t, err)
		require.True(t, ok)

		// A start of the same key is a duplicate of a start in flight, answered at once, as
		// above: it must not park on the other's uncommitted key until the caller's transaction
		// ends. (RunEnqueue and RunReplace do not take the key's lock, so RunStart's try-lock
		// succeeds and its INSERT waits on the unique index.)
		b.requireInFlight(t, "fresh")
		b.requireInFlight(t, "expired")
	})

	t.Run("FinishedRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunDone, fingerprint: []byte{9}, output: []byte(`"out"`), attempts: 2})
		row := b.start(t, b.pool, startParams("s", "k"))
		require.True(t, row.Locked)
		require.False(t, row.Started)
		kr := row.KeyRun
		require.True(t, kr.Found)
		require.Equal(t, "wf", *kr.KeyWorkflow)
		require.Equal(t, store.RunDone, *kr.State)
		require.Equal(t, []byte{9}, kr.Fingerprint)
		require.Equal(t, []byte(`"out"`), kr.Output)
		require.True(t, kr.RunLive)
		require.False(t, kr.LeaseLive)
		require.Nil(t, kr.Token)
		require.Equal(t, 2, b.stored(t, "s", "k").Attempts, "the finished run is left as it was")
	})

	t.Run("AnotherWorkflowsRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", workflow: "other", token: tok, owner: "them", lease: time.Minute, attempts: 1})
		row := b.start(t, b.pool, startParams("s", "k"))
		require.False(t, row.Started)
		kr := row.KeyRun
		require.Equal(t, "other", *kr.KeyWorkflow)
		require.Equal(t, store.RunRunning, *kr.State)
		require.True(t, kr.LeaseLive)
		require.Equal(t, tok, *kr.Token)
		require.Equal(t, 1, kr.Attempts)
		got := b.stored(t, "s", "k")
		require.Equal(t, "other", got.Workflow)
		require.Equal(t, tok, got.Token)
	})

	t.Run("KeyOfDo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "live", time.Hour)
		b.insertDoKey(t, "s", "expired", -time.Hour)
		for _, id := range []string{"live", "expired"} {
			row := b.start(t, b.pool, startParams("s", id))
			require.False(t, row.Started, id)
			require.True(t, row.KeyRun.Found, id)
			require.Nil(t, row.KeyRun.KeyWorkflow, id)
			require.Equal(t, id == "live", row.KeyRun.KeyLive, id)
			require.Nil(t, row.KeyRun.State, id)
			require.Equal(t, 0, b.count(t, "idem_runs", "s", id), id)
		}
	})
}

func TestRunLookup(t *testing.T) {
	t.Parallel()

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		kr, err := b.st.RunLookup(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.False(t, kr.Found)
		require.Nil(t, kr.State)
		require.NotZero(t, kr.Now)
	})

	t.Run("RunningWithLiveLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute, attempts: 3, fingerprint: []byte{7},
			deadline: ptr(time.Hour), lastError: "stuck"})
		// now() is the transaction's start, the same for both statements: the lease has exactly
		// 90.5s left when the lookup reads it.
		tx := b.begin(t)
		_, err := tx.Exec(b.ctx, `UPDATE idem_runs SET lease_expires_at = now() + interval '90.5 seconds'`)
		require.NoError(t, err)
		kr, err := b.st.RunLookup(b.ctx, tx, "s", "k")
		require.NoError(t, err)
		require.True(t, kr.Found)
		require.Equal(t, "wf", *kr.KeyWorkflow)
		require.Equal(t, store.RunRunning, *kr.State)
		require.True(t, kr.RunLive)
		require.True(t, kr.LeaseLive)
		require.Equal(t, 91*time.Second, kr.LeaseLeft, "rounded up to a second")
		require.Equal(t, -90500*time.Millisecond, kr.ExpiredFor)
		require.Equal(t, 3, kr.Attempts)
		require.Equal(t, tok, *kr.Token)
		require.Equal(t, []byte{7}, kr.Fingerprint)
		require.Equal(t, "stuck", kr.LastError)
		got := b.stored(t, "s", "k")
		require.Equal(t, got.CreatedUS, kr.Created)
		require.Equal(t, *got.DeadlineUS, *kr.Deadline)
		within(t, time.Duration(kr.Now-kr.Created)*time.Microsecond, 0, 10*time.Second)

		// It locks nothing.
		fresh := b.begin(t)
		_, err = b.st.RunLookup(b.ctx, fresh, "s", "k")
		require.NoError(t, err)
		var locks int
		require.NoError(t, fresh.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()
	AND (locktype = 'advisory' OR (locktype = 'relation' AND mode <> 'AccessShareLock'))`).Scan(&locks))
		require.Zero(t, locks)
	})

	t.Run("ExpiredLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", token: newToken(), lease: -10 * time.Second})
		kr, err := b.st.RunLookup(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.False(t, kr.LeaseLive)
		require.Zero(t, kr.LeaseLeft)
		within(t, kr.ExpiredFor, 10*time.Second, 20*time.Second)
		require.Nil(t, kr.Deadline)
	})

	t.Run("FinishedRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "live", state: store.RunFailed, output: []byte(`{"error":"x"}`)})
		b.insertRun(t, run{scope: "s", id: "expired", state: store.RunDone, expires: -time.Second})
		kr, err := b.st.RunLookup(b.ctx, b.pool, "s", "live")
		require.NoError(t, err)
		require.Equal(t, store.RunFailed, *kr.State)
		require.Equal(t, []byte(`{"error":"x"}`), kr.Output)
		require.True(t, kr.RunLive)
		require.False(t, kr.LeaseLive)
		kr, err = b.st.RunLookup(b.ctx, b.pool, "s", "expired")
		require.NoError(t, err)
		require.Equal(t, store.RunDone, *kr.State)
		require.False(t, kr.RunLive)
	})

	t.Run("KeyOfDo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "live", time.Hour)
		b.insertDoKey(t, "s", "expired", -time.Hour)
		for _, id := range []string{"live", "expired"} {
			kr, err := b.st.RunLookup(b.ctx, b.pool, "s", id)
			require.NoError(t, err)
			require.True(t, kr.Found)
			require.Nil(t, kr.KeyWorkflow)
			require.Equal(t, id == "live", kr.KeyLive)
			require.Nil(t, kr.State)
		}
	})

	t.Run("AnotherWorkflow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", workflow: "other", state: store.RunSleeping})
		kr, err := b.st.RunLookup(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.Equal(t, "other", *kr.KeyWorkflow)
		require.Equal(t, store.RunSleeping, *kr.State)
		require.True(t, kr.RunLive, "a waiting run has no expiry")
	})
}

func TestRunReplace(t *testing.T) {
	t.Parallel()

	replaceParams := func(id string, leased bool) store.RunReplaceParams {
		p := startParams("s", id)
		p.Workflow = "new"
		return store.RunReplaceParams{RunStartParams: p, Leased: leased}
	}

	t.Run("ExpiredRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunDone, expires: -time.Second, output: []byte(`"old"`)})
		b.insertHistory(t, "s", "k")
		p := replaceParams("k", true)
		r, ok, err := b.st.RunReplace(b.ctx, b.pool, p)
		require.NoError(t, err)
		require.True(t, ok)

		// Nothing of the old run is left to be replayed into the new one.
		require.Equal(t, map[string]int{"idem_keys": 1, "idem_runs": 1, "idem_steps": 0, "idem_step_attempts": 0,
			"idem_signals": 0, "idem_events": 0}, b.history(t, "s", "k"))
		got := b.stored(t, "s", "k")
		require.Equal(t, "new", got.Workflow)
		require.Equal(t, store.RunRunning, got.State)
		require.Nil(t, got.Output)
		require.False(t, got.Finished)
		require.Nil(t, got.ExpiresIn)
		require.Equal(t, 1, got.Attempts)
		require.Equal(t, p.Token, got.Token)
		require.Equal(t, "owner-1", *got.Owner)
		require.Equal(t, r.Created, got.CreatedUS)
		require.Equal(t, r.LeaseExpires, *got.LeaseUS)
		within(t, *got.LeaseLeft, 50*time.Second, time.Minute)
		require.Equal(t, r.Created+time.Hour.Microseconds(), *got.DeadlineUS)
		require.Equal(t, p.Input, got.Input)
		require.Equal(t, p.Fingerprint, got.Fingerprint)

		var workflow string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT workflow FROM idem_keys WHERE scope = 's' AND id = 'k'`).Scan(&workflow))
		require.Equal(t, "new", workflow)
	})

	t.Run("Unleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunCancelled, expires: -time.Second})
		r, ok, err := b.st.RunReplace(b.ctx, b.pool, replaceParams("k", false))
		require.NoError(t, err)
		require.True(t, ok)
		got := b.stored(t, "s", "k")
		require.Zero(t, got.Attempts)
		require.False(t, got.Token.Valid)
		require.Nil(t, got.Owner)
		require.LessOrEqual(t, *got.LeaseLeft, time.Duration(0), "the lease is over at once, for the resume job")
		require.Equal(t, r.LeaseExpires, *got.LeaseUS)
	})

	t.Run("ExpiredKeyOfDo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "k", -time.Second)
		_, ok, err := b.st.RunReplace(b.ctx, b.pool, replaceParams("k", true))
		require.NoError(t, err)
		require.True(t, ok)
		var (
			workflow          string
			result, print     []byte
			infinite, created bool
		)
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT k.workflow, k.result, k.fingerprint, k.expires_at = 'infinity', k.created_at = r.created_at
FROM idem_keys k JOIN idem_runs r USING (scope, id) WHERE scope = 's' AND id = 'k'`).Scan(&workflow, &result, &print, &infinite, &created))
		require.Equal(t, "new", workflow)
		require.Nil(t, result)
		require.Nil(t, print)
		require.True(t, infinite)
		require.True(t, created)
	})

	t.Run("NotReusable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "running", token: newToken(), lease: -time.Minute})
		b.insertRun(t, run{scope: "s", id: "sleeping", state: store.RunSleeping})
		b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone, expires: time.Minute})
		b.insertDoKey(t, "s", "do", time.Minute)
		for _, id := range []string{"running", "sleeping", "done"} {
			b.insertHistory(t, "s", id)
		}
		for _, id := range []string{"running", "sleeping", "done", "do", "missing"} {
			before := b.history(t, "s", id)
			_, ok, err := b.st.RunReplace(b.ctx, b.pool, replaceParams(id, true))
			require.NoError(t, err, id)
			require.False(t, ok, id)
			require.Equal(t, before, b.history(t, "s", id), id)
		}
		require.Equal(t, "wf", b.stored(t, "s", "done").Workflow)
	})
}

func TestRunEnqueue(t *testing.T) {
	t.Parallel()

	t.Run("FreeKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		gen, ok, err := b.st.RunEnqueue(b.ctx, b.pool, store.RunEnqueueParams{Scope: "s", ID: "k", Fingerprint: []byte{3}, Workflow: "wf",
			Input: []byte(`2`), Trace: "tp", Timeout: time.Minute})
		require.NoError(t, err)
		require.True(t, ok)
		got := b.stored(t, "s", "k")
		require.Equal(t, gen, *got.LeaseUS)
		require.Equal(t, store.RunRunning, got.State)
		require.Zero(t, got.Attempts)
		require.False(t, got.Token.Valid)
		require.Nil(t, got.Owner)
		require.LessOrEqual(t, *got.LeaseLeft, time.Duration(0))
		require.Equal(t, got.CreatedUS+time.Minute.Microseconds(), *got.DeadlineUS)
		require.Equal(t, "tp", *got.TraceContext)
		require.Equal(t, []byte(`2`), got.Input)
		require.Equal(t, 1, b.count(t, "idem_keys", "s", "k"))
	})

	t.Run("KeyTaken", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "run", state: store.RunDone, expires: -time.Second})
		b.insertDoKey(t, "s", "do", -time.Second)
		for _, id := range []string{"run", "do"} {
			_, ok, err := b.st.RunEnqueue(b.ctx, b.pool, store.RunEnqueueParams{Scope: "s", ID: id, Workflow: "new"})
			require.NoError(t, err)
			require.False(t, ok, id)
		}
		require.Equal(t, store.RunDone, b.stored(t, "s", "run").State)
		require.Equal(t, 0, b.count(t, "idem_runs", "s", "do"))
	})
}
