package store_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// payload is n bytes of JSON (a string) whose content depends on seed, so that two payloads of
// one size differ.
func payload(n int, seed byte) []byte {
	b := bytes.Repeat([]byte{'a' + seed%26}, n)
	b[0], b[n-1] = '"', '"'
	return b
}

// runDay is the UTC day a run was created on, as the database says.
func (b *testBundle) runDay(t *testing.T, scope, id string) time.Time {
	t.Helper()
	var day time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (created_at AT TIME ZONE 'UTC')::date FROM idem_runs WHERE scope = $1 AND id = $2`,
		scope, id).Scan(&day))
	return day
}

// partitionRows counts the rows of kind of a run in the partition of idem_run_payloads for day.
func (b *testBundle) partitionRows(t *testing.T, day time.Time, scope, id, kind string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+store.PartitionName("idem_run_payloads", day)+`
WHERE scope = $1 AND id = $2 AND kind = $3::"char"`, scope, id, kind).Scan(&n))
	return n
}

// countWhere counts the rows of table under a key that match cond.
func (b *testBundle) countWhere(t *testing.T, table, cond, scope, id string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+table+` WHERE scope = $1 AND id = $2 AND `+cond, scope, id).Scan(&n))
	return n
}

// relationExists reports whether a table of that name exists (attached or not).
func (b *testBundle) relationExists(t *testing.T, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_class WHERE relname = $1 AND relkind IN ('r', 'p'))`, name).Scan(&ok))
	return ok
}

// TestRunPayloads writes a run's step outputs, a signal and an event, small and large, through
// every writer, and reads them back through every reader: the large ones must be in the run's
// start-day partition, not inline, and read back byte for byte.
func TestRunPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := newToken()
	b.insertRun(t, run{scope: "s", id: "r", token: tok, lease: time.Hour})
	created := b.stored(t, "s", "r").CreatedUS
	day := b.runDay(t, "s", "r")
	require.True(t, b.relationExists(t, store.PartitionName("idem_run_payloads", day)), "Migrate made today's partition")

	lease := store.LeaseParams{Scope: "s", ID: "r", Token: tok}
	outs := map[int][]byte{1: payload(100, 1), 2: payload(4<<10, 2), 3: payload(64<<10, 3), 4: payload(store.PayloadInlineMax, 4),
		5: payload(store.PayloadInlineMax+1, 5)}
	tx := b.begin(t)
	// Fenced (the day from the run's row) and in-fenced (the day from created).
	for _, seq := range []int{1, 2, 3} {
		_, err := b.st.StepCheckpoint(store.CheckpointParams{LeaseParams: lease, Seq: seq, Name: "n", Kind: "tx", Output: outs[seq],
			Attempts: 1}).Exec(b.ctx, tx)
		require.NoError(t, err)
	}
	for _, seq := range []int{4, 5} {
		_, err := b.st.StepCheckpointInFenced(store.CheckpointParams{LeaseParams: lease, Seq: seq, Name: "n", Kind: "call",
			Output: outs[seq], Attempts: 1, Created: created}).Exec(b.ctx, tx)
		require.NoError(t, err)
	}
	big := payload(8<<10, 7)
	sig, ok, err := b.st.SignalSend(b.ctx, tx, store.SignalParams{Scope: "s", ID: "r", Name: "big", Payload: big})
	require.NoError(t, err)
	require.True(t, ok)
	require.NotNil(t, sig.Seq)
	_, _, err = b.st.SignalSend(b.ctx, tx, store.SignalParams{Scope: "s", ID: "r", Name: "small", Payload: []byte(`1`)})
	require.NoError(t, err)
	value := payload(5<<10, 9)
	require.NoError(t, b.st.EventSet(b.ctx, tx, "s", "r", "ev", value, created))
	require.NoError(t, tx.Commit(b.ctx))

	// Where they went: large ones to the partition, with NULL and the day in the owner's row.
	var inline, large int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE output IS NOT NULL AND output_day IS NULL),
	count(*) FILTER (WHERE output IS NULL AND output_day = $3) FROM idem_steps WHERE scope = $1 AND id = $2`, "s", "r", day).Scan(&inline, &large))
	require.Equal(t, 2, inline, "up to PayloadInlineMax bytes stay inline")
	require.Equal(t, 3, large)
	require.Equal(t, 3, b.partitionRows(t, day, "s", "r", "s"))
	require.Equal(t, 1, b.partitionRows(t, day, "s", "r", "g"))
	require.Equal(t, 1, b.partitionRows(t, day, "s", "r", "e"))
	var nullPayloads int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM idem_signals WHERE payload IS NULL AND payload_day = $1)
	+ (SELECT count(*) FROM idem_events WHERE value IS NULL AND value_day = $1)`, day).Scan(&nullPayloads))
	require.Equal(t, 2, nullPayloads)

	// The history (resume), the operator's steps, the mailbox and the events.
	hist, err := b.st.RunHistory(b.ctx, b.pool, "s", "r")
	require.NoError(t, err)
	require.Len(t, hist, 5)
	for _, s := range hist {
		require.Equal(t, outs[s.Seq], s.Output, "step %d", s.Seq)
	}
	rows, err := b.st.RunSteps(b.ctx, b.pool, "s", "r")
	require.NoError(t, err)
	require.Len(t, rows, 5)
	for _, s := range rows {
		require.Equal(t, outs[s.Seq], s.Output, "step %d", s.Seq)
	}
	sigs, total, err := b.st.RunSignals(b.ctx, b.pool, "s", "r", 10)
	require.NoError(t, err)
	require.Equal(t, 2, total)
	require.Equal(t, big, sigs[0].Payload)
	require.Equal(t, []byte(`1`), sigs[1].Payload)
	evs, err := b.st.RunEvents(b.ctx, b.pool, "s", "r")
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, value, evs[0].Value)
	ev, ok, err := b.st.EventGet(b.ctx, b.pool, "s", "r", "ev")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, ev.Set)
	require.Equal(t, value, ev.Value)

	// An await consumes the large signal.
	tx = b.begin(t)
	got, ok, err := b.st.SignalConsume(b.ctx, tx, "s", "r", "big", 6)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, *sig.Seq, got.Seq)
	require.Equal(t, big, got.Payload)
	require.NoError(t, tx.Commit(b.ctx))

	// A small value replaces a large one, and a large one a large one.
	require.NoError(t, b.st.EventSet(b.ctx, b.pool, "s", "r", "ev", []byte(`2`), created))
	ev, _, err = b.st.EventGet(b.ctx, b.pool, "s", "r", "ev")
	require.NoError(t, err)
	require.Equal(t, []byte(`2`), ev.Value)
	require.Zero(t, b.countWhere(t, "idem_events", "value_day IS NOT NULL", "s", "r"))
	value2 := payload(3<<10, 11)
	require.NoError(t, b.st.EventSet(b.ctx, b.pool, "s", "r", "ev", value2, created))
	ev, _, err = b.st.EventGet(b.ctx, b.pool, "s", "r", "ev")
	require.NoError(t, err)
	require.Equal(t, value2, ev.Value)
	require.Equal(t, 1, b.partitionRows(t, day, "s", "r", "e"), "overwritten in place")

	// A fork copies the large outputs into its own start day's partition, as its own checkpoints
	// would, and the events its steps set (the large one too); it records where it came from.
	_, err = b.pool.Exec(b.ctx, `UPDATE idem_steps SET kind = 'event', name = 'forked' WHERE scope = 's' AND id = 'r' AND seq = 3`)
	require.NoError(t, err)
	b.insertRun(t, run{scope: "s", id: "fork"})
	forkDay := b.runDay(t, "s", "fork")
	require.NoError(t, b.st.RunForkSteps(b.ctx, b.pool, "s", "r", "s", "fork", 6))
	require.NoError(t, b.st.RunForkEvents(b.ctx, b.pool, "s", "r", "s", "fork", 6))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE output IS NOT NULL AND output_day IS NULL),
	count(*) FILTER (WHERE output IS NULL AND output_day = $3) FROM idem_steps WHERE scope = $1 AND id = $2`, "s", "fork", forkDay).Scan(&inline, &large))
	require.Equal(t, 2, inline)
	require.Equal(t, 3, large)
	require.Equal(t, 3, b.partitionRows(t, forkDay, "s", "fork", "s"))
	require.Equal(t, 1, b.partitionRows(t, forkDay, "s", "fork", "e"), "the large event value too")
	require.Equal(t, 1, b.countWhere(t, "idem_events", "value IS NULL AND value_day IS NOT NULL", "s", "fork"))
	rec, ok, err := b.st.RunGet(b.ctx, b.pool, "s", "fork")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "r", *rec.ForkedID)
	require.Equal(t, 5, *rec.ForkedSteps)
	forked, err := b.st.RunSteps(b.ctx, b.pool, "s", "fork")
	require.NoError(t, err)
	require.Len(t, forked, 5)
	for _, s := range forked {
		require.Equal(t, outs[s.Seq], s.Output, "forked step %d", s.Seq)
	}
	fev, ok, err := b.st.EventGet(b.ctx, b.pool, "s", "fork", "forked")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, outs[3], fev.Value)

	// A payload its owner points to but that is gone is an error, never an empty output.
	_, err = b.pool.Exec(b.ctx, `DELETE FROM idem_run_payloads WHERE scope = 's' AND id = 'r' AND kind = 's' AND ref = '3'`)
	require.NoError(t, err)
	_, err = b.st.RunHistory(b.ctx, b.pool, "s", "r")
	require.ErrorIs(t, err, store.ErrPayloadMissing)
	steps, missing, err := b.st.RunForkCounts(b.ctx, b.pool, "s", "r", 6)
	require.NoError(t, err)
	require.Equal(t, 5, steps)
	require.Equal(t, 1, missing, "what a fork from step 6 would copy as empty")
	_, missing, err = b.st.RunForkCounts(b.ctx, b.pool, "s", "r", 3)
	require.NoError(t, err)
	require.Zero(t, missing, "a fork from step 3 copies steps 1 and 2 only")
}

// TestRunPayloadsInlineWithoutPartition: with no partition for the run's start day, large
// payloads stay in their owners' rows, and read back the same.
func TestRunPayloadsInlineWithoutPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := newToken()
	b.insertRun(t, run{scope: "s", id: "r", token: tok, lease: time.Hour})
	created := b.stored(t, "s", "r").CreatedUS
	day := b.runDay(t, "s", "r")
	part := store.PartitionName("idem_run_payloads", day)
	_, err := b.pool.Exec(b.ctx, `DROP TABLE `+part)
	require.NoError(t, err)

	lease := store.LeaseParams{Scope: "s", ID: "r", Token: tok}
	out1, out2 := payload(4<<10, 1), payload(64<<10, 2)
	tx := b.begin(t)
	_, err = b.st.StepCheckpoint(store.CheckpointParams{LeaseParams: lease, Seq: 1, Name: "a", Kind: "tx", Output: out1, Attempts: 1}).Exec(b.ctx, tx)
	require.NoError(t, err)
	_, err = b.st.StepCheckpointInFenced(store.CheckpointParams{LeaseParams: lease, Seq: 2, Name: "b", Kind: "tx", Output: out2, Attempts: 1,
		Created: created}).Exec(b.ctx, tx)
	require.NoError(t, err)
	big := payload(2<<10, 3)
	_, ok, err := b.st.SignalSend(b.ctx, tx, store.SignalParams{Scope: "s", ID: "r", Name: "big", Payload: big})
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, b.st.EventSet(b.ctx, tx, "s", "r", "ev", big, created))
	require.NoError(t, tx.Commit(b.ctx))

	require.Equal(t, 2, b.countWhere(t, "idem_steps", "output IS NOT NULL AND output_day IS NULL", "s", "r"))
	require.Equal(t, 1, b.countWhere(t, "idem_signals", "payload IS NOT NULL AND payload_day IS NULL", "s", "r"))
	require.Equal(t, 1, b.countWhere(t, "idem_events", "value IS NOT NULL AND value_day IS NULL", "s", "r"))
	require.Zero(t, b.count(t, "idem_run_payloads", "s", "r"))

	hist, err := b.st.RunHistory(b.ctx, b.pool, "s", "r")
	require.NoError(t, err)
	require.Equal(t, out1, hist[0].Output)
	require.Equal(t, out2, hist[1].Output)
	ev, _, err := b.st.EventGet(b.ctx, b.pool, "s", "r", "ev")
	require.NoError(t, err)
	require.Equal(t, big, ev.Value)
	got, ok, err := b.st.SignalConsume(b.ctx, b.pool, "s", "r", "big", 3)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, big, got.Payload)
}

// TestRunPayloadsPartitionDrop: the reaper drops a past day's partition of idem_run_payloads
// once no run created on that day is left, and keeps it while one is, whatever its state (a run
// that sleeps for months pins its start day). The past days' partitions and rows are made by
// SQL, as a week of traffic would have left them.
func TestRunPayloadsPartitionDrop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Three past days: one whose run sleeps, one whose run is finished and expired, one with
	// no run left at all.
	type past struct {
		id    string
		ago   time.Duration
		state store.RunState
	}
	days := []past{{"sleeper", 5 * 24 * time.Hour, store.RunSleeping}, {"done", 4 * 24 * time.Hour, store.RunDone}, {"", 3 * 24 * time.Hour, ""}}
	parts := map[string]string{}
	for _, d := range days {
		var day time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ((now() - $1::int8 * interval '1 microsecond') AT TIME ZONE 'UTC')::date`,
			d.ago.Microseconds()).Scan(&day))
		part := store.PartitionName("idem_run_payloads", day)
		var err error
		require.NoError(t, b.st.MakePartitions(b.ctx, b.pool, "idem_run_payloads", day, day))
		parts[d.id] = part
		id := d.id
		if id == "" {
			id = "gone" // its run was reaped: only its payload is left
		} else {
			r := run{scope: "s", id: id, state: d.state, created: -d.ago}
			if d.state == store.RunDone {
				r.expires = -time.Minute
			}
			b.insertRun(t, r)
			_, err = b.pool.Exec(b.ctx, `INSERT INTO idem_steps (scope, id, seq, name, kind, output_day) VALUES ('s', $1, 1, 'big', 'tx', $2)`, id, day)
			require.NoError(t, err)
			require.Equal(t, day, b.runDay(t, "s", id))
		}
		_, err = b.pool.Exec(b.ctx, `INSERT INTO idem_run_payloads (day, scope, id, kind, ref, data) VALUES ($1, 's', $2, 's', '1', $3)`,
			day, id, payload(4<<10, 1))
		require.NoError(t, err)
	}

	rep, err := b.st.MaintainPartitions(b.ctx, b.pool)
	require.NoError(t, err)
	q := func(name string) string { return `"` + name + `"` } // as MaintainPartitions names them
	require.Contains(t, rep.Dropped, q(parts[""]), "no run of its day is left")
	require.NotContains(t, rep.Dropped, q(parts["sleeper"]))
	require.NotContains(t, rep.Dropped, q(parts["done"]), "its run is expired but not reaped yet")
	require.False(t, b.relationExists(t, parts[""]))
	require.True(t, b.relationExists(t, parts["sleeper"]))
	require.True(t, b.relationExists(t, parts["done"]))
	hist, err := b.st.RunHistory(b.ctx, b.pool, "s", "done")
	require.NoError(t, err)
	require.Len(t, hist[0].Output, 4<<10, "an expired run's history is whole until it is reaped")

	n, _, _, err := b.st.ReapRuns(b.ctx, b.pool, 100, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	rep, err = b.st.MaintainPartitions(b.ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []string{q(parts["done"])}, rep.Dropped, "its run is reaped now")
	require.False(t, b.relationExists(t, parts["done"]))
	require.True(t, b.relationExists(t, parts["sleeper"]), "a sleeping run pins its start day")
	hist, err = b.st.RunHistory(b.ctx, b.pool, "s", "sleeper")
	require.NoError(t, err)
	require.Equal(t, payload(4<<10, 1), hist[0].Output)

	// Today's and yesterday's partitions and the days ahead stay, with or without runs.
	var kept int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'idem_run_payloads'::regclass`).Scan(&kept))
	require.Equal(t, 1+1+1+7, kept, "the sleeper's day, yesterday, today and 7 days ahead")
}
