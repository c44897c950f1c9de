package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

func TestWaitLock(t *testing.T) {
	t.Parallel()

	t.Run("HoldsLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		// A run that resumed inside an await keeps what it waited for, and until when.
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute, deadline: ptr(time.Hour), waitSeq: 2, waitName: "go",
			wakeAt: ptr(time.Minute)})
		tx := b.begin(t)
		w, ok, err := b.st.WaitLock(b.ctx, tx, store.LeaseParams{Scope: "s", ID: "k", Token: tok})
		require.NoError(t, err)
		require.True(t, ok)
		got := b.stored(t, "s", "k")
		require.Equal(t, store.WaitRow{Now: w.Now, Deadline: got.DeadlineUS, Seq: ptr(2), Name: ptr("go"), WakeAt: got.WakeAt}, w)
		within(t, time.Duration(w.Now-got.CreatedUS)*time.Microsecond, 0, 10*time.Second)

		// A signal sent now waits for the wait step to commit, so it is not missed between the
		// mailbox check and the suspension.
		other := b.lockedElsewhere(t)
		_, _, err = b.st.SignalSend(b.ctx, other, store.SignalParams{Scope: "s", ID: "k", Name: "go"})
		require.True(t, isLockTimeout(err), "%v", err)
	})

	t.Run("NotTheLeaseHolder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		b.insertRun(t, run{scope: "s", id: "cancelled", state: store.RunCancelled, token: tok})
		for _, p := range []store.LeaseParams{{Scope: "s", ID: "k", Token: newToken()}, {Scope: "s", ID: "cancelled", Token: tok},
			{Scope: "s", ID: "missing", Token: tok}} {
			tx := b.begin(t)
			_, ok, err := b.st.WaitLock(b.ctx, tx, p)
			require.NoError(t, err)
			require.False(t, ok, p.ID)
			// And it holds no lock: a signal goes through.
			_, _, err = b.st.SignalSend(b.ctx, b.lockedElsewhere(t), store.SignalParams{Scope: "s", ID: p.ID, Name: "go"})
			require.NoError(t, err, p.ID)
		}
	})
}

func TestSignalConsume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "k"})
	first := b.insertSignal(t, "s", "k", "approve", `1`)
	b.insertSignal(t, "s", "k", "reject", `2`)
	second := b.insertSignal(t, "s", "k", "approve", `3`)
	b.insertSignal(t, "s", "other", "approve", `4`)

	for _, want := range []store.SignalConsumed{{Seq: first, Payload: []byte(`1`)}, {Seq: second, Payload: []byte(`3`)}} {
		got, ok, err := b.st.SignalConsume(b.ctx, b.pool, "s", "k", "approve", 5)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, want, got, "oldest first")
	}
	_, ok, err := b.st.SignalConsume(b.ctx, b.pool, "s", "k", "approve", 6)
	require.NoError(t, err)
	require.False(t, ok)

	var consumed, steps5, pending int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE consumed_at IS NOT NULL),
	count(*) FILTER (WHERE consumed_step = 5), count(*) FILTER (WHERE consumed_at IS NULL)
FROM idem_signals WHERE scope = 's' AND id = 'k'`).Scan(&consumed, &steps5, &pending))
	require.Equal(t, 2, consumed)
	require.Equal(t, 2, steps5)
	require.Equal(t, 1, pending, "reject is still pending")
	require.Equal(t, 1, b.count(t, "idem_signals", "s", "other"))
	var otherPending bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT consumed_at IS NULL FROM idem_signals WHERE id = 'other'`).Scan(&otherPending))
	require.True(t, otherPending, "another run's mailbox is its own")
}

func TestRunSuspend(t *testing.T) {
	t.Parallel()

	t.Run("Sleep", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, owner: "me", lease: time.Minute, attempts: 3, lastError: "x"})
		wake := time.Now().Add(time.Hour).UnixMicro()
		ok, err := b.st.RunSuspend(b.ctx, b.pool, store.SuspendParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: tok},
			State: store.RunSleeping, Seq: 4, WakeAt: &wake})
		require.NoError(t, err)
		require.True(t, ok)
		got := b.stored(t, "s", "k")
		require.Equal(t, store.RunSleeping, got.State)
		require.Equal(t, 4, *got.WaitSeq)
		require.Nil(t, got.WaitName)
		require.Equal(t, wake, *got.WakeAt)
		require.False(t, got.Token.Valid, "a waiting run holds no lease")
		require.Nil(t, got.Owner)
		require.Nil(t, got.LeaseLeft)
		require.Nil(t, got.LastError)
		require.Zero(t, got.Attempts)
		require.False(t, got.Finished)
		require.Nil(t, got.ExpiresIn)
	})

	t.Run("Await", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		ok, err := b.st.RunSuspend(b.ctx, b.pool, store.SuspendParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: tok},
			State: store.RunAwaiting, Seq: 2, Signal: ptr("approve")})
		require.NoError(t, err)
		require.True(t, ok)
		got := b.stored(t, "s", "k")
		require.Equal(t, store.RunAwaiting, got.State)
		require.Equal(t, "approve", *got.WaitName)
		require.Nil(t, got.WakeAt, "no timeout")
	})

	t.Run("NotTheLeaseHolder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone, token: tok})
		for _, p := range []store.LeaseParams{{Scope: "s", ID: "k", Token: newToken()}, {Scope: "s", ID: "done", Token: tok}} {
			ok, err := b.st.RunSuspend(b.ctx, b.pool, store.SuspendParams{LeaseParams: p, State: store.RunSleeping, Seq: 1})
			require.NoError(t, err)
			require.False(t, ok, p.ID)
		}
		require.Equal(t, store.RunRunning, b.stored(t, "s", "k").State)
		require.Equal(t, store.RunDone, b.stored(t, "s", "done").State)
	})
}

func TestWaitInspect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "overdue", workflow: "wf", state: store.RunAwaiting, waitSeq: 3, waitName: "go", deadline: ptr(-time.Second)})
	b.insertRun(t, run{scope: "s", id: "sleeping", state: store.RunSleeping, waitSeq: 2, deadline: ptr(time.Hour)})
	b.insertRun(t, run{scope: "s", id: "running"})

	w, ok, err := b.st.WaitInspect(b.ctx, b.pool, "s", "overdue")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, store.WaitInspected{State: store.RunAwaiting, Workflow: "wf", Created: b.stored(t, "s", "overdue").CreatedUS, Seq: 3,
		Overdue: true}, w)

	w, ok, err = b.st.WaitInspect(b.ctx, b.pool, "s", "sleeping")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 2, w.Seq)
	require.False(t, w.Overdue)

	w, ok, err = b.st.WaitInspect(b.ctx, b.pool, "s", "running")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, store.RunRunning, w.State)
	require.Zero(t, w.Seq)
	require.False(t, w.Overdue, "no deadline")

	_, ok, err = b.st.WaitInspect(b.ctx, b.pool, "s", "missing")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestRunWake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "k", state: store.RunSleeping, waitSeq: 2, attempts: 0, input: []byte(`"in"`), trace: "tp"})
	b.insertRun(t, run{scope: "s", id: "any", state: store.RunAwaiting, waitSeq: 7, waitName: "go"})
	b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone, waitSeq: 2})
	gen := b.stored(t, "s", "k").CreatedUS
	wake := func(id string, gen int64, seq int) (store.Claim, bool) {
		t.Helper()
		c, ok, err := b.st.RunWake(b.ctx, b.pool, store.WakeParams{LeaseParams: store.LeaseParams{Scope: "s", ID: id, Token: newToken()},
			Generation: gen, Seq: seq, Owner: "me", Lease: time.Minute})
		require.NoError(t, err)
		return c, ok
	}

	// A job of another generation of the key (an earlier run under it), or for another wait.
	_, ok := wake("k", gen-1, 2)
	require.False(t, ok)
	_, ok = wake("k", gen, 3)
	require.False(t, ok)
	require.Equal(t, store.RunSleeping, b.stored(t, "s", "k").State)

	tok := newToken()
	c, ok, err := b.st.RunWake(b.ctx, b.pool, store.WakeParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: tok},
		Generation: gen, Seq: 2, Owner: "me", Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, store.Claim{Attempts: 1, Input: []byte(`"in"`), Created: gen, Trace: "tp", Now: c.Now}, c)
	got := b.stored(t, "s", "k")
	require.Equal(t, store.RunRunning, got.State)
	require.Equal(t, tok, got.Token)
	require.Equal(t, "me", *got.Owner)
	within(t, *got.LeaseLeft, 50*time.Second, time.Minute)
	require.Equal(t, 2, *got.WaitSeq, "kept, so that an await resumed after a crash keeps its timeout")

	// Woken once: a second job finds it running.
	_, ok = wake("k", gen, 2)
	require.False(t, ok)
	require.Equal(t, tok, b.stored(t, "s", "k").Token)

	// Seq 0 wakes it wherever it waits; a finished run is never woken.
	_, ok = wake("any", b.stored(t, "s", "any").CreatedUS, 0)
	require.True(t, ok)
	_, ok = wake("done", b.stored(t, "s", "done").CreatedUS, 0)
	require.False(t, ok)
}

func TestRunTimeOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "due", state: store.RunAwaiting, waitSeq: 1, deadline: ptr(-time.Second)})
	b.insertRun(t, run{scope: "s", id: "sleeping", state: store.RunSleeping, waitSeq: 1, deadline: ptr(-time.Second)})
	b.insertRun(t, run{scope: "s", id: "early", state: store.RunAwaiting, deadline: ptr(time.Hour)})
	b.insertRun(t, run{scope: "s", id: "none", state: store.RunAwaiting})
	b.insertRun(t, run{scope: "s", id: "running", token: newToken(), lease: time.Minute, deadline: ptr(-time.Second)})
	out := []byte(`{"error":"timed out"}`)
	timeOut := func(id string, gen int64) {
		t.Helper()
		_, err := b.st.RunTimeOut(b.ctx, b.pool, "s", id, gen, out, time.Hour)
		require.NoError(t, err)
	}

	timeOut("due", b.stored(t, "s", "due").CreatedUS-1) // another generation
	require.Equal(t, store.RunAwaiting, b.stored(t, "s", "due").State)

	for _, id := range []string{"due", "sleeping"} {
		timeOut(id, b.stored(t, "s", id).CreatedUS)
		got := b.stored(t, "s", id)
		require.Equal(t, store.RunTimedOut, got.State, id)
		require.Equal(t, out, got.Output)
		require.True(t, got.Finished)
		within(t, *got.ExpiresIn, 50*time.Minute, time.Hour)
	}
	for _, id := range []string{"early", "none", "running"} {
		before := b.stored(t, "s", id)
		timeOut(id, before.CreatedUS)
		got := b.stored(t, "s", id)
		require.Equal(t, before.State, got.State, id)
		require.Nil(t, got.Output, id)
		require.False(t, got.Finished, id)
	}
}

func TestSignalSend(t *testing.T) {
	t.Parallel()

	t.Run("Mailbox", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", token: newToken(), lease: time.Minute})
		s, ok, err := b.st.SignalSend(b.ctx, b.pool, store.SignalParams{Scope: "s", ID: "k", Name: "approve", Payload: []byte(`{"by":"ann"}`)})
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, store.RunRunning, s.State)
		require.False(t, s.Awaits)
		require.NotNil(t, s.Seq)
		require.Equal(t, b.stored(t, "s", "k").CreatedUS, s.Created)
		c, ok, err := b.st.SignalConsume(b.ctx, b.pool, "s", "k", "approve", 1)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, store.SignalConsumed{Seq: *s.Seq, Payload: []byte(`{"by":"ann"}`)}, c)
	})

	t.Run("Awaited", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunAwaiting, waitSeq: 4, waitName: "approve"})
		var suspended int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (extract(epoch FROM updated_at) * 1000000)::int8 FROM idem_runs`).Scan(&suspended))
		s, ok, err := b.st.SignalSend(b.ctx, b.pool, store.SignalParams{Scope: "s", ID: "k", Name: "approve"})
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, store.RunAwaiting, s.State)
		require.True(t, s.Awaits)
		require.Equal(t, 4, s.WaitSeq)
		require.Equal(t, suspended, s.Suspended)
		require.NotNil(t, s.Seq)

		s, _, err = b.st.SignalSend(b.ctx, b.pool, store.SignalParams{Scope: "s", ID: "k", Name: "reject"})
		require.NoError(t, err)
		require.False(t, s.Awaits, "it waits for another signal")
		require.NotNil(t, s.Seq)
	})

	t.Run("Dedupe", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertRun(t, run{scope: "s", id: "k", state: store.RunSleeping})
		b.insertRun(t, run{scope: "s", id: "other", state: store.RunSleeping})
		send := func(id, dedupe string) *int64 {
			t.Helper()
			s, ok, err := b.st.SignalSend(b.ctx, b.pool, store.SignalParams{Scope: "s", ID: id, Name: "paid", DedupeID: dedupe})
			require.NoError(t, err)
			require.True(t, ok)
			return s.Seq
		}
		require.NotNil(t, send("k", "evt-1"))
		require.Nil(t, send("k", "evt-1"), "delivered twice, recorded once")
		require.NotNil(t, send("k", "evt-2"))
		require.NotNil(t, send("other", "evt-1"), "dedupe ids are per run")
		require.NotNil(t, send("k", ""))
		require.NotNil(t, send("k", ""), "no dedupe id: every send counts")
		require.Equal(t, 4, b.count(t, "idem_signals", "s", "k"))
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, state := range []store.RunState{store.RunDone, store.RunFailed, store.RunCancelled, store.RunTimedOut} {
			b.insertRun(t, run{scope: "s", id: string(state), state: state})
			s, ok, err := b.st.SignalSend(b.ctx, b.pool, store.SignalParams{Scope: "s", ID: string(state), Name: "go"})
			require.NoError(t, err)
			require.True(t, ok, "the run is known")
			require.Equal(t, state, s.State)
			require.Nil(t, s.Seq, "a finished run takes no signal")
			require.Equal(t, 0, b.count(t, "idem_signals", "s", string(state)))
		}
		_, ok, err := b.st.SignalSend(b.ctx, b.pool, store.SignalParams{Scope: "s", ID: "missing", Name: "go"})
		require.NoError(t, err)
		require.False(t, ok)
		require.Equal(t, 0, b.count(t, "idem_signals", "s", "missing"))
	})

	t.Run("DoesNotBlockSteps", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		b.insertRun(t, run{scope: "s", id: "k", token: tok, lease: time.Minute})
		tx := b.begin(t)
		_, _, err := b.st.SignalSend(b.ctx, tx, store.SignalParams{Scope: "s", ID: "k", Name: "go"})
		require.NoError(t, err)

		// While the signal is uncommitted, the owner renews and checkpoints without waiting,
		// but a wait step's lock waits for it.
		lease := store.LeaseParams{Scope: "s", ID: "k", Token: tok}
		owner := b.lockedElsewhere(t)
		ok, err := b.st.RunRenew(b.ctx, owner, lease, time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		_, err = b.st.StepCheckpoint(store.CheckpointParams{LeaseParams: lease, Seq: 1, Name: "one", Kind: "tx"}).Exec(b.ctx, owner)
		require.NoError(t, err)
		require.NoError(t, owner.Commit(b.ctx))
		_, _, err = b.st.WaitLock(b.ctx, b.lockedElsewhere(t), lease)
		require.True(t, isLockTimeout(err), "%v", err)
	})
}

func TestRunOverdue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "slept", state: store.RunSleeping, waitSeq: 2, wakeAt: ptr(-10 * time.Second)})
	b.insertRun(t, run{scope: "s", id: "deadline", state: store.RunAwaiting, waitSeq: 3, waitName: "go", deadline: ptr(-20 * time.Second)})
	b.insertRun(t, run{scope: "s", id: "both", state: store.RunAwaiting, wakeAt: ptr(time.Hour), deadline: ptr(-15 * time.Second)})
	b.insertRun(t, run{scope: "s", id: "recent", state: store.RunSleeping, wakeAt: ptr(-time.Second)})
	b.insertRun(t, run{scope: "s", id: "forever", state: store.RunAwaiting, waitName: "go"})
	b.insertRun(t, run{scope: "s", id: "running", deadline: ptr(-time.Hour)})
	b.insertRun(t, run{scope: "s", id: "done", state: store.RunDone, wakeAt: ptr(-time.Hour)})

	rows, err := b.st.RunOverdue(b.ctx, b.pool, 10, 5*time.Second)
	require.NoError(t, err)
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	require.Equal(t, []string{"deadline", "both", "slept"}, ids, "most overdue first; a job due 1s ago may still come")
	require.Equal(t, store.OverdueRow{Scope: "s", ID: "deadline", Created: b.stored(t, "s", "deadline").CreatedUS, Seq: 3}, rows[0])

	rows, err = b.st.RunOverdue(b.ctx, b.pool, 1, 0)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, "deadline", rows[0].ID)
}

func TestEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "k", state: store.RunSleeping})

	e, ok, err := b.st.EventGet(b.ctx, b.pool, "s", "k", "progress")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, store.EventRow{State: store.RunSleeping}, e, "not set yet")

	require.NoError(t, b.st.EventSet(b.ctx, b.pool, "s", "k", "progress", []byte(`10`), 0))
	require.NoError(t, b.st.EventSet(b.ctx, b.pool, "s", "k", "progress", []byte(`20`), 0))
	require.NoError(t, b.st.EventSet(b.ctx, b.pool, "s", "k", "stage", nil, 0))
	e, ok, err = b.st.EventGet(b.ctx, b.pool, "s", "k", "progress")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, store.EventRow{State: store.RunSleeping, Set: true, Value: []byte(`20`)}, e, "the last write wins")
	e, _, err = b.st.EventGet(b.ctx, b.pool, "s", "k", "stage")
	require.NoError(t, err)
	require.True(t, e.Set, "set to null is set")
	require.Equal(t, 2, b.count(t, "idem_events", "s", "k"))

	_, ok, err = b.st.EventGet(b.ctx, b.pool, "s", "missing", "progress")
	require.NoError(t, err)
	require.False(t, ok)
}
