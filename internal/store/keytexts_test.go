package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// The root package's statements (keys.go, the keys' part of admin.go, reap.go), sent as it sends
// them.

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
		row, err := b.st.KeyLookup(b.ctx, tx, "s", "k", lock)
		require.NoError(t, err)
		require.Equal(t, store.KeyRow{Locked: true}, row)
		require.True(t, b.holdsAdvisoryLock(t, tx), "the key is in flight")

		// A duplicate finds it so, without waiting.
		row, err = b.st.KeyLookup(b.ctx, b.lockedElsewhere(t), "s", "k", lock)
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
		row, err := b.st.KeyLookup(b.ctx, tx, "s", "k", lock)
		require.NoError(t, err)
		require.Equal(t, store.KeyRow{Found: true, Fingerprint: []byte{1}, Result: []byte(`{"ok":true}`), Live: true, Locked: true}, row)
		require.False(t, b.holdsAdvisoryLock(t, tx))
	})

	t.Run("ExpiredResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "k", -time.Second)
		tx := b.begin(t)
		row, err := b.st.KeyLookup(b.ctx, tx, "s", "k", store.LockID("", "s", "k"))
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
		row, err := b.st.KeyLookup(b.ctx, b.pool, "s", "k", store.LockID("", "s", "k"))
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
	_, err := b.st.KeyInsert(store.KeyStoreParams{Scope: "s", ID: "k", Fingerprint: []byte{1}, Result: []byte(`"r"`), TTL: time.Hour}).Exec(b.ctx, tx)
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
	_, err = b.st.KeyInsert(store.KeyStoreParams{Scope: "s", ID: "k", Fingerprint: []byte{2}, Result: []byte(`"other"`), TTL: time.Hour}).Exec(b.ctx, b.pool)
	require.True(t, isUniqueViolation(err), "%v", err)
	require.True(t, store.IsKeyTaken(err))
}

func TestKeysReplace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertDoKey(t, "s", "expired", -time.Second)
	b.insertDoKey(t, "s", "renewed", time.Hour)
	b.insertRun(t, run{scope: "s", id: "run"})
	replace := func(id string) error {
		_, err := b.st.KeyReplace(store.KeyStoreParams{Scope: "s", ID: id, Fingerprint: []byte{2}, Result: []byte(`"new"`), TTL: time.Minute}).Exec(b.ctx, b.pool)
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
		r, err := b.st.KeyRunKey(b.ctx, q, "s", id, store.LockID("", "s", id))
		require.NoError(t, err)
		return r.Locked, r.Reusable
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
		require.NoError(t, b.st.KeyClearRun(b.ctx, b.pool, "s", id))
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
		getKey := func(id string) (store.KeyRecord, bool) {
			t.Helper()
			k, ok, err := b.st.KeyGet(b.ctx, b.pool, "s", id)
			require.NoError(t, err)
			return k, ok
		}
		k, ok := getKey("do")
		require.True(t, ok)
		require.Equal(t, []byte{1}, k.Fingerprint)
		require.Equal(t, len(`{"ok":true}`), k.ResultSize)
		require.Nil(t, k.Workflow)
		require.WithinDuration(t, k.Created.Add(time.Hour), *k.Expires, time.Second)
		require.True(t, k.Live)
		require.Nil(t, k.RunState)

		k, ok = getKey("run")
		require.True(t, ok)
		require.Zero(t, k.ResultSize)
		require.Equal(t, "orders", *k.Workflow)
		require.Nil(t, k.Expires, "a run's key expires with its run")
		require.Equal(t, store.RunSleeping, *k.RunState)

		_, ok = getKey("missing")
		require.False(t, ok)
	})

	t.Run("KeyLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		lock := store.LockID("", "s", "k")
		locked, err := b.st.KeyTryLock(b.ctx, b.begin(t), lock)
		require.NoError(t, err)
		require.True(t, locked)
		locked, err = b.st.KeyTryLock(b.ctx, b.lockedElsewhere(t), lock)
		require.NoError(t, err)
		require.False(t, locked)
	})

	t.Run("KeyDelete", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDoKey(t, "s", "do", time.Hour)
		b.insertRun(t, run{scope: "s", id: "run"})
		for id, want := range map[string]bool{"do": true, "run": false, "missing": false} {
			deleted, err := b.st.KeyDelete(b.ctx, b.pool, "s", id)
			require.NoError(t, err)
			require.Equal(t, want, deleted, id)
		}
		require.Equal(t, 1, b.count(t, "idem_keys", "s", "run"), "a run's key is not Do's to delete")

		workflow, found, err := b.st.KeyWorkflow(b.ctx, b.pool, "s", "run")
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, "wf", *workflow)
		_, found, err = b.st.KeyWorkflow(b.ctx, b.pool, "s", "do")
		require.NoError(t, err)
		require.False(t, found, "deleted")
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

		expiry := func(id string) time.Time {
			var at time.Time
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT expires_at FROM idem_keys WHERE id = $1`, id).Scan(&at))
			return at
		}
		older, expired := expiry("older"), expiry("expired")

		reaper := b.lockedElsewhere(t)
		n, last, err := b.st.ReapKeys(b.ctx, reaper, 2, nil)
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
		require.NotNil(t, last)
		require.True(t, last.Equal(older), "the batch ends at the latest expiry it deleted")
		require.NoError(t, reaper.Commit(b.ctx))
		for id, want := range map[string]int{"oldest": 0, "older": 0, "locked": 1, "expired": 1, "live": 1, "run": 1} {
			require.Equal(t, want, b.count(t, "idem_keys", "s", id), id)
		}

		n, last, err = b.st.ReapKeys(b.ctx, b.pool, 10, last)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "a run's key expires never; its run's reaper takes it")
		require.True(t, last.Equal(expired))
		require.Equal(t, 1, b.count(t, "idem_keys", "s", "run"))

		// Let go of the locked key: it is behind the cursor, where only a scan from the start
		// finds it.
		require.NoError(t, other.Rollback(b.ctx))
		n, last, err = b.st.ReapKeys(b.ctx, b.pool, 10, last)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Nil(t, last)
		n, _, err = b.st.ReapKeys(b.ctx, b.pool, 10, nil)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		require.Zero(t, b.count(t, "idem_keys", "s", "locked"))
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

		var after *time.Time
		reap := func(limit int) (n int) {
			t.Helper()
			tx := b.lockedElsewhere(t)
			reaped, _, last, err := b.st.ReapRuns(b.ctx, tx, limit, after)
			require.NoError(t, err)
			if last != nil {
				after = last
			}
			n = int(reaped)
			require.NoError(t, tx.Commit(b.ctx))
			return n
		}
		require.Equal(t, 1, reap(1))
		require.Equal(t, 0, b.count(t, "idem_runs", "s", "done"), "oldest expiry first")
		require.Equal(t, 1, reap(10))
		require.Equal(t, 0, reap(10))

		// The cursor: "locked", which expired first, is behind it once the lock is gone, and is
		// left to a reap that starts afresh.
		require.NoError(t, other.Rollback(b.ctx))
		require.Equal(t, 0, reap(10))
		require.Equal(t, 1, b.count(t, "idem_runs", "s", "locked"))
		after = nil
		require.Equal(t, 1, reap(10))
		require.Equal(t, 0, b.count(t, "idem_runs", "s", "locked"))
		b.insertRun(t, run{scope: "s", id: "locked", state: store.RunCancelled, expires: -3 * time.Hour})
		b.insertHistory(t, "s", "locked")
		other = b.begin(t)
		_, err = other.Exec(b.ctx, `SELECT FROM idem_runs WHERE id = 'locked' FOR UPDATE`)
		require.NoError(t, err)

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
