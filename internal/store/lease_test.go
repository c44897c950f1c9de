package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

func TestRunTakeover(t *testing.T) {
	t.Parallel()

	t.Run("ExpiredLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		old := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: old, owner: "dead", lease: -time.Second, attempts: 2, input: []byte(`"in"`),
			trace: "tp", deadline: ptr(time.Hour)})
		tok := newToken()
		c, ok, err := b.st.RunTakeover(b.ctx, b.pool, store.TakeoverParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: tok}, Old: &old,
			Owner: "me", Lease: time.Minute, Version: "v2"})
		require.NoError(t, err)
		require.True(t, ok)
		var attemptVersion string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT attempt_version FROM idem_runs WHERE id = 'k'`).Scan(&attemptVersion))
		require.Equal(t, "v2", attemptVersion, "the taker's version is the attempt's")
		got := b.stored(t, "s", "k")
		require.Equal(t, store.Claim{Attempts: 3, Input: []byte(`"in"`), Created: got.CreatedUS, Trace: "tp", Now: c.Now,
			Deadline: got.DeadlineUS}, c)
		within(t, time.Duration(c.Now-got.CreatedUS)*time.Microsecond, 0, 10*time.Second)
		require.Equal(t, 3, got.Attempts)
		require.Equal(t, tok, got.Token)
		require.Equal(t, "me", *got.Owner)
		within(t, *got.LeaseLeft, 50*time.Second, time.Minute)
	})

	t.Run("NoTokenBefore", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// An enqueued run has no token: the taker saw none.
		b.insertRun(t, run{scope: "s", id: "k", lease: -time.Millisecond})
		c, ok, err := b.st.RunTakeover(b.ctx, b.pool, store.TakeoverParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: newToken()}, Old: nil, Owner: "me", Lease: time.Minute})
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, 1, c.Attempts)
		require.Nil(t, c.Deadline)
		require.Empty(t, c.Trace)
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		old := newToken()
		b.insertRun(t, run{scope: "s", id: "live", token: old, lease: time.Minute})
		b.insertRun(t, run{scope: "s", id: "expired", token: old, lease: -time.Second})
		b.insertRun(t, run{scope: "s", id: "sleeping", state: store.RunSleeping})
		b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone})
		for _, c := range []struct {
			id  string
			old *pgtype.UUID
		}{
			{"live", &old},               // its owner is alive
			{"expired", ptr(newToken())}, // someone took it since the taker looked
			{"expired", nil},
			{"sleeping", nil},
			{"done", nil},
			{"missing", nil},
		} {
			before := b.storedOrZero(t, "s", c.id)
			_, ok, err := b.st.RunTakeover(b.ctx, b.pool, store.TakeoverParams{LeaseParams: store.LeaseParams{Scope: "s", ID: c.id, Token: newToken()}, Old: c.old, Owner: "me", Lease: time.Minute})
			require.NoError(t, err, c.id)
			require.False(t, ok, c.id)
			require.Equal(t, before, b.storedOrZero(t, "s", c.id), c.id)
		}
	})

	t.Run("OneOfTwoTakersWins", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		old := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: old, lease: -time.Second, attempts: 1})
		first, second := newToken(), newToken()
		tx := b.begin(t)
		_, ok, err := b.st.RunTakeover(b.ctx, tx, store.TakeoverParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: first}, Old: &old, Owner: "first", Lease: time.Minute})
		require.NoError(t, err)
		require.True(t, ok)

		// The second waits for the first's row lock and then finds the token it saw gone.
		type result struct {
			ok  bool
			err error
		}
		done := make(chan result, 1)
		go func() {
			_, ok, err := b.st.RunTakeover(b.ctx, b.pool, store.TakeoverParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: second}, Old: &old, Owner: "second", Lease: time.Minute})
			done <- result{ok, err}
		}()
		b.waitForLockWaiter(t)
		require.NoError(t, tx.Commit(b.ctx))
		r := <-done
		require.NoError(t, r.err)
		require.False(t, r.ok)
		got := b.stored(t, "s", "k")
		require.Equal(t, first, got.Token)
		require.Equal(t, 2, got.Attempts)
	})
}

// storedOrZero is stored, or the zero value when there is no run.
func (b *testBundle) storedOrZero(t *testing.T, scope, id string) stored {
	t.Helper()
	if b.count(t, "idem_runs", scope, id) == 0 {
		return stored{}
	}
	s := b.stored(t, scope, id)
	s.LeaseLeft, s.ExpiresIn = nil, nil // they move with the clock
	return s
}

// waitForLockWaiter waits until a session of the test's database waits for a lock, so that a
// test can release it knowing the waiter got there first.
func (b *testBundle) waitForLockWaiter(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond)
}

func TestRunRenew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := newToken()
	b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Second})
	b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone, token: tok}) // only its state refuses it

	ok, err := b.st.RunRenew(b.ctx, b.pool, store.LeaseParams{Scope: "s", ID: "k", Token: tok}, time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	within(t, *b.stored(t, "s", "k").LeaseLeft, 50*time.Minute, time.Hour)

	for _, p := range []store.LeaseParams{{Scope: "s", ID: "k", Token: newToken()}, {Scope: "s", ID: "done", Token: tok},
		{Scope: "s", ID: "missing", Token: tok}} {
		ok, err := b.st.RunRenew(b.ctx, b.pool, p, 2*time.Hour)
		require.NoError(t, err)
		require.False(t, ok, p.ID)
	}
	within(t, *b.stored(t, "s", "k").LeaseLeft, 50*time.Minute, time.Hour)
}

func TestRunFinish(t *testing.T) {
	t.Parallel()

	t.Run("HoldsLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, owner: "me", lease: time.Minute, lastError: "earlier"})
		tx := b.begin(t)
		_, err := b.st.RunFinish(store.RunFinishParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: tok},
			State: store.RunDone, Output: []byte(`"out"`), TTL: time.Hour}).Exec(b.ctx, tx)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(b.ctx))
		got := b.stored(t, "s", "k")
		require.Equal(t, store.RunDone, got.State)
		require.Equal(t, []byte(`"out"`), got.Output)
		require.False(t, got.Token.Valid)
		require.Nil(t, got.Owner)
		require.Nil(t, got.LeaseLeft)
		require.Nil(t, got.LastError)
		require.True(t, got.Finished)
		within(t, *got.ExpiresIn, 50*time.Minute, time.Hour)
	})

	t.Run("FenceAbortsTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone, token: tok})
		for _, p := range []store.LeaseParams{{Scope: "s", ID: "k", Token: newToken()}, {Scope: "s", ID: "done", Token: tok},
			{Scope: "s", ID: "missing", Token: tok}} {
			tx := b.begin(t)
			// A write of the step that ends the run, queued before the outcome.
			_, err := b.st.StepCheckpointInFenced(store.CheckpointParams{LeaseParams: p, Seq: 1, Name: "last", Kind: "tx"}).Exec(b.ctx, tx)
			require.NoError(t, err)
			_, err = b.st.RunFinish(store.RunFinishParams{LeaseParams: p, State: store.RunFailed, TTL: time.Hour}).Exec(b.ctx, tx)
			require.True(t, store.IsFinishFenceError(err), "%s: %v", p.ID, err)
			require.False(t, store.IsFenceError(err))
			require.Error(t, tx.Commit(b.ctx), "the transaction is aborted")
			require.Equal(t, 0, b.count(t, "idem_steps", "s", p.ID), p.ID)
		}
		require.Equal(t, store.RunRunning, b.stored(t, "s", "k").State)
		require.Equal(t, tok, b.stored(t, "s", "k").Token)
	})
}

func TestIsFinishFenceError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `SELECT nope FROM idem_runs`)
	require.False(t, store.IsFinishFenceError(err))
	require.False(t, store.IsFinishFenceError(nil))
}

func TestRunStuck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := newToken()
	b.insertRun(t, run{scope: "s", id: "k", token: tok, owner: "me", lease: time.Minute})
	require.NoError(t, b.st.RunStuck(b.ctx, b.pool, store.LeaseParams{Scope: "s", ID: "k", Token: newToken()}, "not mine"))
	require.Nil(t, b.stored(t, "s", "k").LastError)

	require.NoError(t, b.st.RunStuck(b.ctx, b.pool, store.LeaseParams{Scope: "s", ID: "k", Token: tok}, "workflow changed"))
	got := b.stored(t, "s", "k")
	require.Equal(t, "workflow changed", *got.LastError)
	// The lease stays: the run is retried when it runs out.
	require.Equal(t, store.RunRunning, got.State)
	require.Equal(t, tok, got.Token)
	within(t, *got.LeaseLeft, 50*time.Second, time.Minute)
}

func TestRunScan(t *testing.T) {
	t.Parallel()

	t.Run("ExpiredOldestFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "c", token: newToken(), lease: -10 * time.Second, attempts: 3})
		b.insertRun(t, run{scope: "s", id: "a", token: newToken(), lease: -30 * time.Second, attempts: 1})
		b.insertRun(t, run{scope: "t", id: "b", lease: -20 * time.Second})
		b.insertRun(t, run{scope: "s", id: "live", token: newToken(), lease: time.Minute})
		b.insertRun(t, run{scope: "s", id: "sleeping", state: store.RunSleeping})
		b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone})

		rows, err := b.st.RunScan(b.ctx, b.pool, 10)
		require.NoError(t, err)
		require.Len(t, rows, 3)
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.Scope+"/"+r.ID)
		}
		require.Equal(t, []string{"s/a", "t/b", "s/c"}, ids)
		require.Equal(t, 1, rows[0].Attempts)
		require.Equal(t, *b.stored(t, "s", "a").LeaseUS, rows[0].LeaseExpiry)

		rows, err = b.st.RunScan(b.ctx, b.pool, 1)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, "a", rows[0].ID)
	})

	t.Run("SkipLocked", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, id := range []string{"a", "b", "c"} {
			b.insertRun(t, run{scope: "s", id: id, lease: -time.Second})
		}
		// A checkpoint being committed holds b's row.
		other := b.begin(t)
		_, err := other.Exec(b.ctx, `SELECT FROM idem_runs WHERE scope = 's' AND id = 'b' FOR UPDATE`)
		require.NoError(t, err)

		scan := b.lockedElsewhere(t)
		rows, err := b.st.RunScan(b.ctx, scan, 10)
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"a", "c"}, scanIDs(rows))

		// Another scan meanwhile passes over what the first holds.
		second := b.lockedElsewhere(t)
		rows, err = b.st.RunScan(b.ctx, second, 10)
		require.NoError(t, err)
		require.Empty(t, rows)
		require.NoError(t, second.Commit(b.ctx))

		// And the first holds its rows until it ends.
		b.requireRunHeld(t, "s", "a")
	})
}

func scanIDs(rows []store.ScanRow) []string {
	ids := make([]string, 0, len(rows))
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestRunNextExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, ok, err := b.st.RunNextExpiry(b.ctx, b.pool)
	require.NoError(t, err)
	require.False(t, ok)

	b.insertRun(t, run{scope: "s", id: "expired", token: newToken(), lease: -time.Second})
	b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone})
	_, ok, err = b.st.RunNextExpiry(b.ctx, b.pool)
	require.NoError(t, err)
	require.False(t, ok, "an expired lease is the scan's, not the next expiry")

	b.insertRun(t, run{scope: "s", id: "later", token: newToken(), lease: 20 * time.Second})
	b.insertRun(t, run{scope: "s", id: "next", token: newToken(), lease: 10 * time.Second})
	d, ok, err := b.st.RunNextExpiry(b.ctx, b.pool)
	require.NoError(t, err)
	require.True(t, ok)
	within(t, d, 5*time.Second, 10*time.Second)
}

func TestRunInspect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := newToken()
	b.insertRun(t, run{scope: "s", id: "k", workflow: "wf", token: tok, lease: -3 * time.Second, attempts: 2, input: []byte(`"in"`),
		lastError: "panic", trace: "tp"})
	b.insertStep(t, "s", "k", 1, "one", "")
	b.insertStep(t, "s", "k", 2, "two", "")
	b.insertRun(t, run{scope: "s", id: "sleeping", state: store.RunSleeping})

	r, ok, err := b.st.RunInspect(b.ctx, b.pool, "s", "k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, store.RunRunning, r.State)
	require.Equal(t, "wf", r.Workflow)
	require.Equal(t, []byte(`"in"`), r.Input)
	require.Equal(t, 2, r.Attempts)
	require.True(t, *r.Expired)
	require.Equal(t, tok, *r.Token)
	within(t, r.ExpiredFor, 3*time.Second, 13*time.Second)
	require.Equal(t, "two", r.RecoveryPoint)
	require.Equal(t, "panic", r.LastError)
	require.Equal(t, b.stored(t, "s", "k").CreatedUS, r.Created)
	require.Equal(t, "tp", r.Trace)

	r, ok, err = b.st.RunInspect(b.ctx, b.pool, "s", "sleeping")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, store.RunSleeping, r.State)
	require.Nil(t, r.Expired, "no lease")
	require.Nil(t, r.Token)
	require.Empty(t, r.RecoveryPoint)
	require.Zero(t, r.ExpiredFor)

	_, ok, err = b.st.RunInspect(b.ctx, b.pool, "s", "missing")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestRunCountByState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	counts, err := b.st.RunCountByState(b.ctx, b.pool)
	require.NoError(t, err)
	require.Empty(t, counts)

	for i, state := range []store.RunState{store.RunRunning, store.RunRunning, store.RunSleeping, store.RunAwaiting, store.RunFailed,
		store.RunCancelled, store.RunTimedOut, store.RunDone, store.RunDone} {
		b.insertRun(t, run{scope: "s", id: string(rune('a' + i)), state: state})
	}
	counts, err = b.st.RunCountByState(b.ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, map[store.RunState]int64{store.RunRunning: 2, store.RunSleeping: 1, store.RunAwaiting: 1, store.RunFailed: 1,
		store.RunCancelled: 1, store.RunTimedOut: 1}, counts, "done runs are left out")
}

func TestRunReconcile(t *testing.T) {
	t.Parallel()

	// Both are fenced like a takeover: only a running run whose lease ran out and still has the
	// token that was inspected.
	refusals := func(t *testing.T, b *testBundle, call func(id string, old *pgtype.UUID) bool) {
		t.Helper()
		old := newToken()
		b.insertRun(t, run{scope: "s", id: "live", token: old, lease: time.Minute})
		b.insertRun(t, run{scope: "s", id: "taken", token: newToken(), lease: -time.Second})
		b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone, token: old, lease: -time.Second})
		for _, id := range []string{"live", "taken", "done", "missing"} {
			before := b.storedOrZero(t, "s", id)
			require.False(t, call(id, &old), id)
			require.Equal(t, before, b.storedOrZero(t, "s", id), id)
		}
	}

	t.Run("End", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		old := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: old, owner: "dead", lease: -time.Second})
		ok, err := b.st.RunReconcileEnd(b.ctx, b.pool, "s", "k", &old, store.RunFailed, []byte(`{"error":"gave up"}`), time.Hour)
		require.NoError(t, err)
		require.True(t, ok)
		got := b.stored(t, "s", "k")
		require.Equal(t, store.RunFailed, got.State)
		require.Equal(t, []byte(`{"error":"gave up"}`), got.Output)
		require.False(t, got.Token.Valid)
		require.Nil(t, got.Owner)
		require.Nil(t, got.LeaseLeft)
		require.True(t, got.Finished)
		within(t, *got.ExpiresIn, 50*time.Minute, time.Hour)

		refusals(t, b, func(id string, old *pgtype.UUID) bool {
			ok, err := b.st.RunReconcileEnd(b.ctx, b.pool, "s", id, old, store.RunDone, nil, time.Hour)
			require.NoError(t, err)
			return ok
		})
	})

	t.Run("Resume", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", owner: "dead", lease: -time.Second, attempts: 5}) // enqueued: no token
		ok, err := b.st.RunReconcileResume(b.ctx, b.pool, "s", "k", nil, time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		got := b.stored(t, "s", "k")
		require.Equal(t, store.RunRunning, got.State)
		require.Zero(t, got.Attempts, "a fresh budget of attempts")
		require.False(t, got.Token.Valid)
		require.Nil(t, got.Owner)
		within(t, *got.LeaseLeft, 50*time.Second, time.Minute)

		refusals(t, b, func(id string, old *pgtype.UUID) bool {
			ok, err := b.st.RunReconcileResume(b.ctx, b.pool, "s", id, old, time.Minute)
			require.NoError(t, err)
			return ok
		})
	})
}
