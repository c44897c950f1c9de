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

	t.Run("StatementsReadTheOffset", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		prod, virtual := store.For(""), store.ForVirtualClock("")
		require.NoError(t, virtual.VirtualClockCreate(b.ctx, b.pool))
		require.NoError(t, virtual.VirtualClockCreate(b.ctx, b.pool), "creating it again keeps it")

		real, err := prod.ClockNow(b.ctx, b.pool)
		require.NoError(t, err)
		now, err := virtual.ClockNow(b.ctx, b.pool)
		require.NoError(t, err)
		require.WithinDuration(t, real, now, time.Minute, "a new clock reads Postgres's time")

		const month = 30 * 24 * time.Hour
		require.NoError(t, virtual.VirtualClockSet(b.ctx, b.pool, month))
		now, err = virtual.ClockNow(b.ctx, b.pool)
		require.NoError(t, err)
		require.WithinDuration(t, real.Add(month), now, time.Minute)
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
		require.WithinDuration(t, now, time.UnixMicro(row.Created), time.Minute)
		kr, err := virtual.RunLookup(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.True(t, kr.LeaseLive, "the lease runs a minute from the virtual now")
		kr, err = prod.RunLookup(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.True(t, kr.LeaseLive, "and, read by Postgres's clock, a month from now")
		require.NoError(t, virtual.VirtualClockSet(b.ctx, b.pool, month+2*time.Minute))
		kr, err = virtual.RunLookup(b.ctx, b.pool, "s", "k")
		require.NoError(t, err)
		require.False(t, kr.LeaseLive, "moving the clock past it expires the lease")
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
	})
}
