package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

func TestVirtualClock(t *testing.T) {
	t.Parallel()

	t.Run("StatementsReadIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		prod, virtual := store.For(""), store.ForVirtualClock("")
		require.NoError(t, virtual.VirtualClockCreate(b.ctx, b.pool))
		real, err := prod.ClockNow(b.ctx, b.pool)
		require.NoError(t, err)
		start, err := virtual.ClockNow(b.ctx, b.pool)
		require.NoError(t, err)
		require.WithinDuration(t, real, start, time.Minute, "a new clock starts at Postgres's time")
		require.NoError(t, virtual.VirtualClockCreate(b.ctx, b.pool), "creating it again keeps it")
		again, err := virtual.ClockNow(b.ctx, b.pool)
		require.NoError(t, err)
		require.Equal(t, start, again, "and it stands still")

		const month = 30 * 24 * time.Hour
		require.NoError(t, virtual.VirtualClockSet(b.ctx, b.pool, start.Add(month)))
		now, err := virtual.ClockNow(b.ctx, b.pool)
		require.NoError(t, err)
		require.Equal(t, start.Add(month), now)
		real, err = prod.ClockNow(b.ctx, b.pool)
		require.NoError(t, err)
		require.Less(t, real, now.Add(-month+time.Minute), "production statements keep Postgres's clock")

		// A run started by the virtual statements is created, and leased, in virtual time.
		token := pgtype.UUID{Bytes: [16]byte{1}, Valid: true}
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		s := virtual.RunStart(store.RunStartParams{Scope: "s", ID: "k", Workflow: "w", Input: []byte("1"), Token: token, Owner: "me", Lease: time.Minute})
		row, err := store.ScanRunStart(tx.QueryRow(b.ctx, s.SQL, s.Args...))
		require.NoError(t, err)
		require.True(t, row.Started)
		require.NoError(t, tx.Commit(b.ctx))
		require.Equal(t, now.UnixMicro(), row.Created)
		kr, err := virtual.RunLookup(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.True(t, kr.LeaseLive, "the lease runs a minute from the virtual now")
		kr, err = prod.RunLookup(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.True(t, kr.LeaseLive, "and, read by Postgres's clock, a month from now")
		require.NoError(t, virtual.VirtualClockSet(b.ctx, b.pool, now.Add(time.Minute)))
		kr, err = virtual.RunLookup(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.False(t, kr.LeaseLive, "moving the clock to its end expires the lease")
	})

	t.Run("Schema", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(b.ctx, `CREATE SCHEMA app`)
		require.NoError(t, err)
		virtual := store.ForVirtualClock("app")
		require.NoError(t, virtual.VirtualClockCreate(b.ctx, b.pool))
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM app.idem_test_clock`).Scan(&n))
		require.Equal(t, 1, n)
		_, err = virtual.ClockNow(b.ctx, b.pool)
		require.NoError(t, err)
	})
}

// TestTestJobs: a test engine's jobs are kept in the transaction that makes them, and taken in
// the order they fall due, by the virtual clock when they were made "at once".
func TestTestJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := store.ForVirtualClock("")
	require.NoError(t, st.VirtualClockCreate(b.ctx, b.pool))
	require.NoError(t, st.TestJobsCreate(b.ctx, b.pool))
	require.NoError(t, st.TestJobsCreate(b.ctx, b.pool))
	now, err := st.ClockNow(b.ctx, b.pool)
	require.NoError(t, err)

	_, ok, err := st.TestJobNext(b.ctx, b.pool)
	require.NoError(t, err)
	require.False(t, ok)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	require.NoError(t, st.TestJobInsert(b.ctx, tx, "lost", []byte(`{}`), time.Time{}))
	require.NoError(t, tx.Rollback(b.ctx))
	require.NoError(t, st.TestJobInsert(b.ctx, b.pool, "later", []byte(`{"n":2}`), now.Add(time.Hour)))
	require.NoError(t, st.TestJobInsert(b.ctx, b.pool, "now", []byte(`{"n":1}`), time.Time{}))

	next, ok, err := st.TestJobNext(b.ctx, b.pool)
	require.NoError(t, err)
	require.True(t, ok)
	require.WithinDuration(t, now, next, time.Minute, "a job made at once is due at the virtual now")
	_, ok, err = st.TestJobTake(b.ctx, b.pool, now.Add(-time.Hour))
	require.NoError(t, err)
	require.False(t, ok, "nothing is due an hour ago")
	j, ok, err := st.TestJobTake(b.ctx, b.pool, now.Add(2*time.Hour))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "now", j.Kind)
	j, ok, err = st.TestJobTake(b.ctx, b.pool, now.Add(2*time.Hour))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "later", j.Kind)
	require.JSONEq(t, `{"n":2}`, string(j.Args))
	require.WithinDuration(t, now.Add(time.Hour), j.RunAt, time.Millisecond)
	_, ok, err = st.TestJobTake(b.ctx, b.pool, now.Add(2*time.Hour))
	require.NoError(t, err)
	require.False(t, ok, "the rolled-back job was never kept")
}
