package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// The texts in Keys, KeyAdmin and Reap are sent by the root package; these tests send them as it
// does, with the arguments their doc comments list.

// holdsAdvisoryLock reports whether q's session holds an advisory lock.
func (b *testBundle) holdsAdvisoryLock(t *testing.T, q store.Querier) bool {
	t.Helper()
	var n int
	require.NoError(t, q.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'`).Scan(&n))
	return n > 0
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

func TestLookupKey(t *testing.T) {
	t.Parallel()

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		lock := store.LockID("", "s", "k")
		tx := b.begin(t)
		row, err := store.LookupKey(b.ctx, tx, b.st, "s", "k", lock)
		require.NoError(t, err)
		require.Equal(t, store.KeyRow{Locked: true}, row)
		require.True(t, b.holdsAdvisoryLock(t, tx), "the key is in flight")

		// A duplicate finds it so, without waiting.
		row, err = store.LookupKey(b.ctx, b.lockedElsewhere(t), b.st, "s", "k", lock)
		require.NoError(t, err)
		require.False(t, row.Found)
		require.False(t, row.Locked)
	})

	t.Run("LiveResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "k", time.Hour)
		lock := store.LockID("", "s", "k")
		// Replays take no lock, so they never contend, even with a Do that holds it.
		other := b.begin(t)
		_, err := other.Exec(b.ctx, `SELECT pg_advisory_xact_lock($1)`, lock)
		require.NoError(t, err)
		tx := b.begin(t)
		row, err := store.LookupKey(b.ctx, tx, b.st, "s", "k", lock)
		require.NoError(t, err)
		require.Equal(t, store.KeyRow{Found: true, Fingerprint: []byte{1}, Result: []byte(`{"ok":true}`), Live: true, Locked: true}, row)
		require.False(t, b.holdsAdvisoryLock(t, tx))
	})

	t.Run("ExpiredResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "k", -time.Second)
		tx := b.begin(t)
		row, err := store.LookupKey(b.ctx, tx, b.st, "s", "k", store.LockID("", "s", "k"))
		require.NoError(t, err)
		require.True(t, row.Found)
		require.False(t, row.Live)
		require.True(t, row.Locked)
		require.True(t, b.holdsAdvisoryLock(t, tx))
	})

	t.Run("RunsKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", workflow: "orders"})
		row, err := store.LookupKey(b.ctx, b.pool, b.st, "s", "k", store.LockID("", "s", "k"))
		require.NoError(t, err)
		require.True(t, row.Found)
		require.Equal(t, "orders", *row.Workflow)
		require.Nil(t, row.Result)
	})
}

func TestKeysInsert(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx := b.begin(t)
	var txStart time.Time
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT now()`).Scan(&txStart))
	_, err := tx.Exec(b.ctx, b.st.Keys.Insert, "s", "k", []byte{1}, []byte(`"r"`), time.Hour.Microseconds())
	require.NoError(t, err)
	var (
		created time.Time
		ttl     time.Duration
		result  []byte
	)
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT created_at, (extract(epoch FROM expires_at - created_at) * 1000000)::int8 * 1000, result
FROM idem_keys WHERE scope = 's' AND id = 'k'`).Scan(&created, &ttl, &result))
	require.True(t, created.After(txStart), "the TTL counts from the write, not from the transaction's start")
	require.Equal(t, time.Hour, ttl)
	require.Equal(t, []byte(`"r"`), result)
	require.NoError(t, tx.Commit(b.ctx))

	// A racer that committed the key first wins; this write aborts.
	_, err = b.pool.Exec(b.ctx, b.st.Keys.Insert, "s", "k", []byte{2}, []byte(`"other"`), time.Hour.Microseconds())
	require.True(t, isUniqueViolation(err), "%v", err)
}

func TestKeysReplace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertDoKey(t, "s", "expired", -time.Second)
	b.insertDoKey(t, "s", "renewed", time.Hour)
	b.insertRun(t, run{scope: "s", id: "run"})
	replace := func(id string) error {
		_, err := b.pool.Exec(b.ctx, b.st.Keys.Replace, "s", id, []byte{2}, []byte(`"new"`), time.Minute.Microseconds())
		return err
	}
	result := func(id string) (res []byte, live bool) {
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT result, expires_at > now() FROM idem_keys WHERE scope = 's' AND id = $1`, id).
			Scan(&res, &live))
		return res, live
	}

	require.NoError(t, replace("expired"))
	res, live := result("expired")
	require.Equal(t, []byte(`"new"`), res)
	require.True(t, live)

	require.NoError(t, replace("reaped"), "a key the reaper deleted meanwhile is inserted afresh")
	res, _ = result("reaped")
	require.Equal(t, []byte(`"new"`), res)

	// A racer renewed it, or it belongs to a run: the INSERT aborts on the row that is there.
	require.True(t, isUniqueViolation(replace("renewed")))
	res, _ = result("renewed")
	require.Equal(t, []byte(`{"ok":true}`), res)
	require.True(t, isUniqueViolation(replace("run")))
}

func TestKeysRunKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "expired", state: store.RunDone, expires: -time.Second})
	b.insertRun(t, run{scope: "s", id: "live", state: store.RunDone})
	b.insertRun(t, run{scope: "s", id: "running", token: newToken(), lease: -time.Second})
	runKey := func(q store.Querier, id string) (locked, reusable bool) {
		t.Helper()
		require.NoError(t, q.QueryRow(b.ctx, b.st.Keys.RunKey, "s", id, store.LockID("", "s", id)).Scan(&locked, &reusable))
		return locked, reusable
	}

	tx := b.begin(t)
	locked, reusable := runKey(tx, "expired")
	require.True(t, locked)
	require.True(t, reusable)
	locked, reusable = runKey(b.lockedElsewhere(t), "expired")
	require.False(t, locked, "the first holds the key's lock")
	require.True(t, reusable)
	for _, id := range []string{"live", "running", "missing"} {
		_, reusable := runKey(b.pool, id)
		require.False(t, reusable, id)
	}
}

func TestKeysClearRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "expired", state: store.RunDone, expires: -time.Second})
	b.insertRun(t, run{scope: "s", id: "live", state: store.RunDone})
	for _, id := range []string{"expired", "live"} {
		b.insertHistory(t, "s", id)
		_, err := b.pool.Exec(b.ctx, b.st.Keys.ClearRun, "s", id)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]int{"idem_keys": 0, "idem_runs": 0, "idem_steps": 0, "idem_step_attempts": 0, "idem_signals": 0,
		"idem_events": 0}, b.history(t, "s", "expired"))
	require.Equal(t, map[string]int{"idem_keys": 1, "idem_runs": 1, "idem_steps": 1, "idem_step_attempts": 1, "idem_signals": 1,
		"idem_events": 1}, b.history(t, "s", "live"))
}

func TestKeyAdmin(t *testing.T) {
	t.Parallel()

	t.Run("KeyGet", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "do", time.Hour)
		b.insertRun(t, run{scope: "s", id: "run", workflow: "orders", state: store.RunSleeping})
		var (
			print           []byte
			size            *int32
			workflow, state *string
			created         time.Time
			expires         *time.Time
			live            bool
			getKey          = func(id string) error {
				return b.pool.QueryRow(b.ctx, b.st.KeyAdmin.KeyGet, "s", id).Scan(&print, &size, &workflow, &created, &expires, &live, &state)
			}
		)
		require.NoError(t, getKey("do"))
		require.Equal(t, []byte{1}, print)
		require.Equal(t, int32(len(`{"ok":true}`)), *size)
		require.Nil(t, workflow)
		require.WithinDuration(t, created.Add(time.Hour), *expires, time.Second)
		require.True(t, live)
		require.Nil(t, state)

		require.NoError(t, getKey("run"))
		require.Nil(t, size)
		require.Equal(t, "orders", *workflow)
		require.Nil(t, expires, "a run's key expires with its run")
		require.Equal(t, "sleeping", *state)

		require.True(t, errors.Is(getKey("missing"), pgx.ErrNoRows))
	})

	t.Run("KeyLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		lock := store.LockID("", "s", "k")
		var locked bool
		require.NoError(t, b.begin(t).QueryRow(b.ctx, b.st.KeyAdmin.KeyLock, lock).Scan(&locked))
		require.True(t, locked)
		require.NoError(t, b.lockedElsewhere(t).QueryRow(b.ctx, b.st.KeyAdmin.KeyLock, lock).Scan(&locked))
		require.False(t, locked)
	})

	t.Run("KeyDelete", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "do", time.Hour)
		b.insertRun(t, run{scope: "s", id: "run"})
		for id, want := range map[string]int64{"do": 1, "run": 0, "missing": 0} {
			tag, err := b.pool.Exec(b.ctx, b.st.KeyAdmin.KeyDelete, "s", id)
			require.NoError(t, err)
			require.Equal(t, want, tag.RowsAffected(), id)
		}
		require.Equal(t, 1, b.count(t, "idem_keys", "s", "run"), "a run's key is not Do's to delete")

		var workflow *string
		require.NoError(t, b.pool.QueryRow(b.ctx, b.st.KeyAdmin.KeyWorkflow, "s", "run").Scan(&workflow))
		require.Equal(t, "wf", *workflow)
		require.True(t, errors.Is(b.pool.QueryRow(b.ctx, b.st.KeyAdmin.KeyWorkflow, "s", "do").Scan(&workflow), pgx.ErrNoRows))
	})
}

func TestReap(t *testing.T) {
	t.Parallel()

	t.Run("Keys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "oldest", -3*time.Hour)
		b.insertDoKey(t, "s", "older", -2*time.Hour)
		b.insertDoKey(t, "s", "locked", -4*time.Hour)
		b.insertDoKey(t, "s", "expired", -time.Hour)
		b.insertDoKey(t, "s", "live", time.Hour)
		b.insertRun(t, run{scope: "s", id: "run", state: store.RunDone, expires: -time.Hour})
		// A Do replacing this key right now holds it.
		other := b.begin(t)
		_, err := other.Exec(b.ctx, `SELECT FROM idem_keys WHERE id = 'locked' FOR UPDATE`)
		require.NoError(t, err)

		reaper := b.lockedElsewhere(t)
		tag, err := reaper.Exec(b.ctx, b.st.Reap.Keys, 2)
		require.NoError(t, err)
		require.EqualValues(t, 2, tag.RowsAffected())
		require.NoError(t, reaper.Commit(b.ctx))
		for id, want := range map[string]int{"oldest": 0, "older": 0, "locked": 1, "expired": 1, "live": 1, "run": 1} {
			require.Equal(t, want, b.count(t, "idem_keys", "s", id), id)
		}

		tag, err = b.pool.Exec(b.ctx, b.st.Reap.Keys, 10)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected(), "a run's key expires never; its run's reaper takes it")
		require.Equal(t, 1, b.count(t, "idem_keys", "s", "run"))
	})

	t.Run("Runs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, r := range []run{
			{scope: "s", id: "done", state: store.RunDone, expires: -2 * time.Hour},
			{scope: "s", id: "failed", state: store.RunFailed, expires: -time.Hour},
			{scope: "s", id: "locked", state: store.RunCancelled, expires: -3 * time.Hour},
			{scope: "s", id: "live", state: store.RunDone, expires: time.Hour},
			{scope: "s", id: "running", token: newToken(), lease: -time.Hour},
			{scope: "s", id: "sleeping", state: store.RunSleeping, wakeAt: ptr(-time.Hour)},
		} {
			b.insertRun(t, r)
			b.insertHistory(t, r.scope, r.id)
		}
		other := b.begin(t)
		_, err := other.Exec(b.ctx, `SELECT FROM idem_runs WHERE id = 'locked' FOR UPDATE`)
		require.NoError(t, err)

		reap := func(limit int) (n int) {
			t.Helper()
			tx := b.lockedElsewhere(t)
			require.NoError(t, tx.QueryRow(b.ctx, b.st.Reap.Runs, limit).Scan(&n))
			require.NoError(t, tx.Commit(b.ctx))
			return n
		}
		require.Equal(t, 1, reap(1))
		require.Equal(t, 0, b.count(t, "idem_runs", "s", "done"), "oldest expiry first")
		require.Equal(t, 1, reap(10))
		require.Equal(t, 0, reap(10))

		gone := map[string]int{"idem_keys": 0, "idem_runs": 0, "idem_steps": 0, "idem_step_attempts": 0, "idem_signals": 0, "idem_events": 0}
		kept := map[string]int{"idem_keys": 1, "idem_runs": 1, "idem_steps": 1, "idem_step_attempts": 1, "idem_signals": 1, "idem_events": 1}
		for _, id := range []string{"done", "failed"} {
			require.Equal(t, gone, b.history(t, "s", id), id)
		}
		for _, id := range []string{"locked", "live", "running", "sleeping"} {
			require.Equal(t, kept, b.history(t, "s", id), id)
		}
	})
}
