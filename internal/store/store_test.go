package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

func TestFor(t *testing.T) {
	t.Parallel()

	t.Run("OnePerSchema", func(t *testing.T) {
		t.Parallel()
		// Built once and kept, so that a statement's text is the same on every call and pgx
		// prepares it once per connection.
		require.Same(t, store.For("billing"), store.For("billing"))
		require.NotSame(t, store.For("billing"), store.For("shipping"))
		require.Equal(t, `"billing"."idem_runs"`, store.For("billing").Tables.Runs)
	})

	t.Run("TablesIn", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, store.Tables{Keys: "idem_keys", Runs: "idem_runs", Steps: "idem_steps", Attempts: "idem_step_attempts",
			Migrations: "idem_migrations", Signals: "idem_signals", Events: "idem_events", Schedules: "idem_schedules", Outbox: "idem_outbox",
			OutboxKeys: "idem_outbox_keys", OutboxLanes: "idem_outbox_lanes", OutboxRelays: "idem_outbox_relays",
			OutboxPosSeq: "'idem_outbox_pos_seq'", Results: "idem_results", OutboxPayloads: "idem_outbox_payloads",
			RunPayloads: "idem_run_payloads"}, store.TablesIn(""))
		// The sequence is named inside a string literal: a quote in the schema is doubled.
		require.Equal(t, `'"it''s"."idem_outbox_pos_seq"'`, store.TablesIn("it's").OutboxPosSeq)
		// A name that needs quoting is quoted, so that it cannot end the identifier.
		require.Equal(t, `"Tenant ""7"""."idem_step_attempts"`, store.TablesIn(`Tenant "7"`).Attempts)
	})

	t.Run("SchemaQualifiesEveryStatement", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Tables in a schema that needs quoting, and none in the default one: a statement that
		// forgot to qualify a table would fail (or use the wrong one).
		const schema = "Tenant-7"
		pool := b.pool
		require.NoError(t, idem.MigrateTo(b.ctx, pool, 0))
		require.NoError(t, idem.Migrate(b.ctx, pool, idem.Schema(schema)))
		st := store.For(schema)
		ctx := b.ctx

		tok := newToken()
		start := st.RunStart(store.RunStartParams{Scope: "s", ID: "k", Workflow: "wf", Input: []byte(`1`), Token: tok, Owner: "me",
			Lease: time.Minute})
		tx := b.begin(t)
		row, err := store.ScanRunStart(tx.QueryRow(ctx, start.SQL, start.Args...))
		require.NoError(t, err)
		require.True(t, row.Started)
		lease := store.LeaseParams{Scope: "s", ID: "k", Token: tok}
		_, err = st.StepCheckpoint(store.CheckpointParams{LeaseParams: lease, Seq: 1, Name: "one", Kind: "tx", Output: []byte(`1`),
			Attempts: 1}).Exec(ctx, tx)
		require.NoError(t, err)
		_, err = st.StepAttempt(store.AttemptParams{LeaseParams: lease, Seq: 2, Name: "two", Kind: "tx", Attempt: 1,
			Outcome: store.AttemptRetried, Error: "boom", Keep: 3}).Exec(ctx, tx)
		require.NoError(t, err)
		sig, ok, err := st.SignalSend(ctx, tx, store.SignalParams{Scope: "s", ID: "k", Name: "go"})
		require.NoError(t, err)
		require.True(t, ok)
		require.NotNil(t, sig.Seq)
		require.NoError(t, st.EventSet(ctx, tx, "s", "k", "ev", []byte(`2`), 0))
		require.NoError(t, tx.Commit(ctx))

		kr, err := st.RunLookup(ctx, pool, "s", "k")
		require.NoError(t, err)
		require.Equal(t, store.RunRunning, *kr.State)
		hist, err := st.RunHistory(ctx, pool, "s", "k")
		require.NoError(t, err)
		require.Len(t, hist, 1)
		attempts, err := st.RunAttempts(ctx, pool, "s", "k")
		require.NoError(t, err)
		require.Len(t, attempts, 1)
		list, err := st.RunList(ctx, pool, store.RunFilter{Limit: 10})
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, 1, list[0].PendingSignals)
		_, _, err = st.ScheduleUpsert(ctx, pool, store.ScheduleUpsertParams{Name: "n", Workflow: "wf", Scope: "s", Every: time.Hour,
			TimeZone: "UTC", Input: []byte(`1`), Overlap: "skip", CatchUp: "latest", NextTick: time.Now()})
		require.NoError(t, err)
		claimed, _, ok, err := st.ScheduleClaim(ctx, pool, nil, nil)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "n", claimed.Name)

		// The fence's error names the table without its schema, so IsFenceError knows it here too.
		_, err = st.StepCheckpoint(store.CheckpointParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: newToken()},
			Seq: 2, Name: "two", Kind: "tx"}).Exec(ctx, pool)
		require.True(t, store.IsFenceError(err), "%v", err)

		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM "Tenant-7".idem_runs) + (SELECT count(*) FROM "Tenant-7".idem_keys)
	+ (SELECT count(*) FROM "Tenant-7".idem_steps) + (SELECT count(*) FROM "Tenant-7".idem_step_attempts)
	+ (SELECT count(*) FROM "Tenant-7".idem_signals) + (SELECT count(*) FROM "Tenant-7".idem_events)
	+ (SELECT count(*) FROM "Tenant-7".idem_schedules)`).Scan(&n))
		require.Equal(t, 7, n)

		// The default schema has no tables now: its statements say so.
		_, err = store.For("").RunLookup(ctx, pool, "s", "k")
		require.True(t, store.IsMissingTable(err), "%v", err)
	})

	t.Run("SchemasDoNotShareLocks", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, idem.Migrate(b.ctx, b.pool, idem.Schema("other")))
		// Two installations in one database start a run under the same key at the same time:
		// each takes a lock of its own.
		for _, schema := range []string{"", "other"} {
			start := store.For(schema).RunStart(store.RunStartParams{Scope: "s", ID: "k", Workflow: "wf", Token: newToken(),
				Owner: "me", Lease: time.Minute})
			require.Equal(t, store.LockID(schema, "s", "k"), start.Args[9])
			row, err := store.ScanRunStart(b.begin(t).QueryRow(b.ctx, start.SQL, start.Args...))
			require.NoError(t, err)
			require.True(t, row.Locked, "schema %q", schema)
			require.True(t, row.Started, "schema %q", schema)
		}
	})
}

func TestIsMissingTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, _, err := store.For("nowhere").RunGet(b.ctx, b.pool, "s", "k")
	require.True(t, store.IsMissingTable(err), "%v", err)

	// Other errors are not, nor is a missing row.
	_, err = b.pool.Exec(b.ctx, `SELECT 1/0`)
	require.Error(t, err)
	require.False(t, store.IsMissingTable(err))
	_, err = b.pool.Exec(b.ctx, `SELECT nope FROM idem_runs`)
	require.Error(t, err)
	require.False(t, store.IsMissingTable(err))
	require.False(t, store.IsMissingTable(pgx.ErrNoRows))
	require.False(t, store.IsMissingTable(nil))
}

func TestRunState(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		state             store.RunState
		finished, waiting bool
	}{
		{store.RunRunning, false, false},
		{store.RunSleeping, false, true},
		{store.RunAwaiting, false, true},
		{store.RunDone, true, false},
		{store.RunFailed, true, false},
		{store.RunCancelled, true, false},
		{store.RunTimedOut, true, false},
	} {
		require.Equal(t, c.finished, c.state.Finished(), c.state)
		require.Equal(t, c.waiting, c.state.Waiting(), c.state)
	}
}
