package store_test

import (
	"crypto/rand"
	"encoding/binary"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

func msg(key string) store.OutboxMessage {
	return store.OutboxMessage{ID: uuid.Must(uuid.NewV7()), Topic: "t", Key: key, Hash: 7, Payload: []byte("p")}
}

// appendTx writes msgs in t.
func (b *testBundle) appendTx(t *testing.T, tx pgx.Tx, msgs ...store.OutboxMessage) {
	t.Helper()
	stmt, err := b.st.OutboxAppend(msgs)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, stmt.SQL, stmt.Args...)
	require.NoError(t, err)
}

func (b *testBundle) append(t *testing.T, msgs ...store.OutboxMessage) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		b.appendTx(t, tx, msgs...)
		return nil
	}))
}

func (b *testBundle) get(t *testing.T, id [16]byte) store.OutboxRow {
	t.Helper()
	r, err := b.st.OutboxGet(b.ctx, b.pool, id)
	require.NoError(t, err)
	return r
}

func (b *testBundle) fetch(t *testing.T, p store.OutboxFetchParams) store.OutboxFetched {
	t.Helper()
	if p.Lanes == 0 {
		p.Lanes, p.Live, p.Owned, p.Limit = 1, []int32{0}, []int32{0}, 100
	}
	f, err := b.st.OutboxFetch(b.ctx, b.pool, p)
	require.NoError(t, err)
	return f
}

func TestOutboxAppend(t *testing.T) {
	t.Parallel()

	t.Run("SequencePerKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a1, a2, c1, none := msg("a"), msg("a"), msg("c"), msg("")
		none.Headers = map[string]string{"h": "v"}
		b.append(t, a1)
		b.append(t, a2, c1, none)
		require.EqualValues(t, 1, b.get(t, a1.ID).Seq)
		require.EqualValues(t, 2, b.get(t, a2.ID).Seq)
		require.EqualValues(t, 1, b.get(t, c1.ID).Seq)
		got := b.get(t, none.ID)
		require.Zero(t, got.Seq, "a message without a key has no sequence number")
		require.Equal(t, map[string]string{"h": "v"}, got.Headers)
		require.Less(t, b.get(t, a1.ID).Pos, b.get(t, a2.ID).Pos)
	})

	t.Run("BatchNumbersInOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := msg("k")
		b.append(t, first)
		batch := []store.OutboxMessage{msg("k"), msg("x"), msg("k"), msg(""), msg("k")}
		b.append(t, batch...)
		var prev int64
		for i, want := range []int64{2, 1, 3, 0, 4} {
			r := b.get(t, batch[i].ID)
			require.Equal(t, want, r.Seq, "message %d", i)
			require.Greater(t, r.Pos, prev, "positions follow the batch's order")
			prev = r.Pos
		}
	})

	// A second writer of a key waits for the first, so the key's numbers and positions follow
	// the order of the COMMITs, not of the statements.
	t.Run("SecondWriterWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.append(t, msg("k"))
		first, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = first.Rollback(b.ctx) }()
		m1 := msg("k")
		b.appendTx(t, first, m1)

		m2 := msg("k")
		done := make(chan error, 1)
		go func() {
			done <- pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
				stmt, err := b.st.OutboxAppend([]store.OutboxMessage{m2})
				if err != nil {
					return err
				}
				_, err = tx.Exec(b.ctx, stmt.SQL, stmt.Args...)
				return err
			})
		}()
		select {
		case err := <-done:
			t.Fatalf("the second writer did not wait for the first: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		require.NoError(t, first.Commit(b.ctx))
		require.NoError(t, <-done)
		r1, r2 := b.get(t, m1.ID), b.get(t, m2.ID)
		require.EqualValues(t, 2, r1.Seq)
		require.EqualValues(t, 3, r2.Seq)
		require.Less(t, r1.Pos, r2.Pos)
	})

	t.Run("RolledBackWriterLeavesNoGap", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		b.appendTx(t, tx, msg("k"))
		require.NoError(t, tx.Rollback(b.ctx))
		m := msg("k")
		b.append(t, m)
		require.EqualValues(t, 1, b.get(t, m.ID).Seq)
	})
}

func TestOutboxFetch(t *testing.T) {
	t.Parallel()

	t.Run("NewThenLate", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cursor, start, err := b.st.OutboxStart(b.ctx, b.pool)
		require.NoError(t, err)
		require.GreaterOrEqual(t, start.Next, start.Xmax)

		// A takes its position first and commits after B: the relay reads B, remembers A's
		// transaction, and finds A's message by it once A has committed.
		slow, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = slow.Rollback(b.ctx) }()
		late := msg("a")
		b.appendTx(t, slow, late)
		var xid uint64
		require.NoError(t, slow.QueryRow(b.ctx, `SELECT pg_current_xact_id()::text::int8`).Scan(&xid))
		fresh := msg("b")
		b.append(t, fresh)

		f := b.fetch(t, store.OutboxFetchParams{Cursor: cursor, From: start.Xmax})
		require.Len(t, f.New, 1)
		require.Equal(t, fresh.ID, f.New[0].ID)
		require.Contains(t, f.Snapshot.Xip, xid, "the writer still in progress is listed: a later xid completed")
		require.Greater(t, f.NowUS, int64(0))
		cursor = f.New[0].Pos
		require.Greater(t, cursor, b.getPosOf(t, slow, late.ID), "the relay has read past the slow writer's position")

		f = b.fetch(t, store.OutboxFetchParams{Cursor: cursor, Late: f.Snapshot.Xip, From: f.Snapshot.Xmax})
		require.Empty(t, f.New)
		require.Empty(t, f.Late, "not visible before its COMMIT")
		require.NoError(t, slow.Commit(b.ctx))

		f = b.fetch(t, store.OutboxFetchParams{Cursor: cursor, Late: []uint64{xid}, From: f.Snapshot.Xmax})
		require.Empty(t, f.New)
		require.Len(t, f.Late, 1)
		require.Equal(t, late.ID, f.Late[0].ID)
		require.False(t, f.Snapshot.InProgress(xid))
	})

	// A holds a higher xid than B, and B completes first: Postgres lists no in-progress xid
	// above the latest completed one, so A is not in the snapshot's list, and is found as one of
	// the xids from the snapshot's xmax on.
	t.Run("UnlistedXid", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cursor, start, err := b.st.OutboxStart(b.ctx, b.pool)
		require.NoError(t, err)
		first, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = first.Rollback(b.ctx) }()
		_, err = first.Exec(b.ctx, `SELECT pg_current_xact_id()`)
		require.NoError(t, err)
		slow, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = slow.Rollback(b.ctx) }()
		late := msg("a")
		b.appendTx(t, slow, late)
		var xid uint64
		require.NoError(t, slow.QueryRow(b.ctx, `SELECT pg_current_xact_id()::text::int8`).Scan(&xid))
		b.appendTx(t, first, msg("b"))
		require.NoError(t, first.Commit(b.ctx))

		f := b.fetch(t, store.OutboxFetchParams{Cursor: cursor, From: start.Xmax})
		require.Len(t, f.New, 1)
		require.Greater(t, f.Snapshot.Next, xid, "the next xid bounds every xid assigned before the snapshot")
		var listed []uint64
		if slices.Contains(f.Snapshot.Xip, xid) {
			// On a server shared with other work, a later xid of someone else's may complete
			// between the two commits and make A listed after all: the lookup by xid finds it.
			t.Logf("xid %d was listed (xmax %d): another session's transaction completed meanwhile", xid, f.Snapshot.Xmax)
			listed = []uint64{xid}
		} else {
			require.GreaterOrEqual(t, xid, f.Snapshot.Xmax, "in progress above the xmax, so not listed")
		}
		cursor = f.New[0].Pos
		require.NoError(t, slow.Commit(b.ctx))
		f = b.fetch(t, store.OutboxFetchParams{Cursor: cursor, Late: listed, From: f.Snapshot.Xmax})
		require.Len(t, f.Late, 1)
		require.Equal(t, late.ID, f.Late[0].ID)
	})

	t.Run("LanesAndLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var msgs []store.OutboxMessage
		for i := range 10 {
			m := msg(strconv.Itoa(i))
			m.Hash = int32(i)
			msgs = append(msgs, m)
		}
		b.append(t, msgs...)
		f := b.fetch(t, store.OutboxFetchParams{Limit: 3, Lanes: 2, Live: []int32{1}, Owned: []int32{1}})
		require.Len(t, f.New, 3)
		for i, r := range f.New {
			require.Equal(t, msgs[2*i+1].ID, r.ID, "odd hashes, in position order")
		}
		rows, now, err := b.st.OutboxCatchUp(b.ctx, b.pool, f.New[0].Pos, f.New[2].Pos, 10, 2, []int32{0})
		require.NoError(t, err)
		require.Len(t, rows, 2, "lane 0 between the first and the third of lane 1")
		require.Greater(t, now, int64(0))
	})
}

func TestOutboxLanes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n, err := b.st.OutboxLanesInit(b.ctx, b.pool, 4)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	n, err = b.st.OutboxLanesInit(b.ctx, b.pool, 8)
	require.NoError(t, err)
	require.Equal(t, 4, n, "the lanes are made once")

	live, err := b.st.OutboxHeartbeat(b.ctx, b.pool, "b", time.Minute.Microseconds())
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, live)
	live, err = b.st.OutboxHeartbeat(b.ctx, b.pool, "a", time.Minute.Microseconds())
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, live)

	got, err := b.st.OutboxAcquire(b.ctx, b.pool, "a", time.Minute.Microseconds(), 3)
	require.NoError(t, err)
	require.Len(t, got, 3)
	other, err := b.st.OutboxAcquire(b.ctx, b.pool, "b", time.Minute.Microseconds(), 3)
	require.NoError(t, err)
	require.Len(t, other, 1, "one lane was left")

	held := []store.LaneToken{got[0].LaneToken, got[1].LaneToken}
	held[0].Floor = 42
	m := msg("k")
	m.Hash = got[0].Lane
	b.append(t, m)

	t.Run("WriteIsFenced", func(t *testing.T) {
		still, written, err := b.st.OutboxWriteAll(b.ctx, b.pool, []store.LaneToken{{Lane: got[0].Lane, Token: uuid.New()}}, []store.OutboxWrite{{ID: m.ID, Lane: got[0].Lane, Published: true, Attempts: 1}})
		require.NoError(t, err)
		require.Empty(t, still, "a wrong token holds nothing")
		require.Zero(t, written)
		require.Nil(t, b.get(t, m.ID).PublishedAt)

		still, written, err = b.st.OutboxWriteAll(b.ctx, b.pool, held, []store.OutboxWrite{{ID: m.ID, Lane: got[0].Lane, Attempts: 2, Error: "nope", Status: "stopped"}})
		require.NoError(t, err)
		require.ElementsMatch(t, []int32{got[0].Lane, got[1].Lane}, still)
		require.EqualValues(t, 1, written)
		r := b.get(t, m.ID)
		require.Equal(t, "stopped", r.Status)
		require.Equal(t, 2, r.Attempts)
		require.Equal(t, "nope", r.LastError)
	})

	t.Run("OperatorRetryRewinds", func(t *testing.T) {
		changed, err := b.st.OutboxSetStatus(b.ctx, b.pool, m.ID, "", []string{"stopped", "dead"})
		require.NoError(t, err)
		require.True(t, changed)
		changed, err = b.st.OutboxSetStatus(b.ctx, b.pool, m.ID, "", []string{"stopped", "dead"})
		require.NoError(t, err)
		require.False(t, changed, "only a stopped or dead message")
		r := b.get(t, m.ID)
		require.Equal(t, "", r.Status)
		require.Zero(t, r.Attempts)

		renewed, err := b.st.OutboxRenew(b.ctx, b.pool, "a", held, time.Minute.Microseconds())
		require.NoError(t, err)
		require.Len(t, renewed, 2)
		for _, l := range renewed {
			if l.Lane == got[0].Lane {
				require.Equal(t, r.Pos, l.Rewind, "the owner is asked to read its lane again")
			} else {
				require.Zero(t, l.Rewind)
			}
		}
		renewed, err = b.st.OutboxRenew(b.ctx, b.pool, "a", held, time.Minute.Microseconds())
		require.NoError(t, err)
		require.Zero(t, renewed[0].Rewind+renewed[1].Rewind, "a rewind is handed over once")
	})

	t.Run("ExpiredLeaseIsTakenOver", func(t *testing.T) {
		_, err := b.pool.Exec(b.ctx, `UPDATE idem_outbox_lanes SET expires_at = now() - interval '1 second' WHERE lane = $1`, got[0].Lane)
		require.NoError(t, err)
		still, written, err := b.st.OutboxWriteAll(b.ctx, b.pool, held, []store.OutboxWrite{{ID: m.ID, Lane: got[0].Lane, Published: true}})
		require.NoError(t, err)
		require.Equal(t, []int32{got[1].Lane}, still, "a lease that ran out fences its writes")
		require.Zero(t, written)
		taken, err := b.st.OutboxAcquire(b.ctx, b.pool, "b", time.Minute.Microseconds(), 4)
		require.NoError(t, err)
		require.Len(t, taken, 1)
		require.Equal(t, got[0].Lane, taken[0].Lane)
		require.EqualValues(t, 42, taken[0].Floor, "the floor the last owner recorded")
		renewed, err := b.st.OutboxRenew(b.ctx, b.pool, "a", held, time.Minute.Microseconds())
		require.NoError(t, err)
		require.Len(t, renewed, 1, "the old token renews nothing")

		release := taken[0].LaneToken
		release.Floor = 0
		require.NoError(t, b.st.OutboxRelease(b.ctx, b.pool, "b", []store.LaneToken{release}))
		lanes, err := b.st.OutboxLanes(b.ctx, b.pool)
		require.NoError(t, err)
		require.Len(t, lanes, 4)
		require.Equal(t, "", lanes[got[0].Lane].Owner)
		require.NotNil(t, lanes[got[0].Lane].Oldest, "its message is not published")
		require.NoError(t, b.st.OutboxLeave(b.ctx, b.pool, "b"))
		live, err := b.st.OutboxHeartbeat(b.ctx, b.pool, "a", time.Minute.Microseconds())
		require.NoError(t, err)
		require.Equal(t, []string{"a"}, live)
	})
}

func TestOutboxList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ms := []store.OutboxMessage{msg("a"), msg("b"), msg("a")}
	ms[1].Topic = "other"
	b.append(t, ms...)
	_, err := b.pool.Exec(b.ctx, `UPDATE idem_outbox SET status = 'dead' WHERE id = $1`, ms[1].ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE idem_outbox SET published_at = now() WHERE id = $1`, ms[2].ID)
	require.NoError(t, err)
	for _, c := range []struct {
		p    store.OutboxListParams
		want []store.OutboxMessage
	}{
		{store.OutboxListParams{Status: "all"}, ms},
		{store.OutboxListParams{Status: "attention"}, ms[1:2]},
		{store.OutboxListParams{Status: "dead"}, ms[1:2]},
		{store.OutboxListParams{Status: "stopped"}, nil},
		{store.OutboxListParams{Status: "pending"}, ms[:1]},
		{store.OutboxListParams{Status: "published"}, ms[2:]},
		{store.OutboxListParams{Status: "all", Key: "a"}, []store.OutboxMessage{ms[0], ms[2]}},
		{store.OutboxListParams{Status: "all", Topic: "other"}, ms[1:2]},
		{store.OutboxListParams{Status: "all", Limit: 1}, ms[:1]},
	} {
		if c.p.Limit == 0 {
			c.p.Limit = 10
		}
		rows, err := b.st.OutboxList(b.ctx, b.pool, c.p)
		require.NoError(t, err)
		var ids []uuid.UUID
		for _, r := range rows {
			ids = append(ids, r.ID)
		}
		var want []uuid.UUID
		for _, m := range c.want {
			want = append(want, m.ID)
		}
		require.Equal(t, want, ids, "%+v", c.p)
	}
	_, err = b.st.OutboxList(b.ctx, b.pool, store.OutboxListParams{Status: "bogus"})
	require.Error(t, err)
}

// idAt makes a UUIDv7 of the time at.
func idAt(at time.Time) [16]byte {
	var id [16]byte
	_, _ = rand.Read(id[:])
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(id[:6], ms[2:])
	id[6] = 0x70 | id[6]&0x0f
	id[8] = 0x80 | id[8]&0x3f
	return id
}

// TestOutboxReapCursor: each batch starts after the id where the last ended, and a message behind
// the cursor is left to a call that starts afresh.
func TestOutboxReapCursor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-time.Hour)
	ms := []store.OutboxMessage{msg("a"), msg("b"), msg("c")}
	for i := range ms {
		ms[i].ID = idAt(old.Add(time.Duration(i) * time.Second))
	}
	b.append(t, ms...)
	_, err := b.pool.Exec(b.ctx, `UPDATE idem_outbox SET published_at = now() - interval '1 hour'`)
	require.NoError(t, err)
	retention := time.Minute.Microseconds()

	n, last, err := b.st.ReapOutbox(b.ctx, b.pool, 1, retention, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, uuid.UUID(ms[0].ID), *last, "the oldest first")
	second := uuid.UUID(ms[1].ID)
	n, last, err = b.st.ReapOutbox(b.ctx, b.pool, 10, retention, &second)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only what is after the cursor")
	require.Equal(t, uuid.UUID(ms[2].ID), *last)
	b.get(t, ms[1].ID)
	n, last, err = b.st.ReapOutbox(b.ctx, b.pool, 10, retention, last)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Nil(t, last, "nothing deleted, no cursor")
	n, _, err = b.st.ReapOutbox(b.ctx, b.pool, 10, retention, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "a call from the start finds the message left behind")
}

func TestOutboxReap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-time.Hour)
	published, unpublished, recent, dead, skipped, kept := msg("a"), msg("b"), msg("c"), msg("d"), msg("e"), msg("a")
	for _, m := range []*store.OutboxMessage{&published, &unpublished, &dead, &skipped} {
		m.ID = idAt(old)
	}
	b.append(t, published, unpublished, recent, dead, skipped)
	_, err := b.pool.Exec(b.ctx, `UPDATE idem_outbox SET published_at = now() - interval '1 hour' WHERE id = ANY($1)`,
		[]uuid.UUID{published.ID, recent.ID})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE idem_outbox SET status = 'dead' WHERE id = $1`, dead.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE idem_outbox SET status = 'skipped', created_at = now() - interval '1 hour' WHERE id = $1`, skipped.ID)
	require.NoError(t, err)

	n, _, err := b.st.ReapOutbox(b.ctx, b.pool, 100, time.Minute.Microseconds(), nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the published and the skipped message past the retention")
	for _, m := range []store.OutboxMessage{unpublished, recent, dead} {
		b.get(t, m.ID)
	}
	_, err = b.st.OutboxGet(b.ctx, b.pool, published.ID)
	require.ErrorIs(t, err, pgx.ErrNoRows)

	var keys []string
	rows, err := b.pool.Query(b.ctx, `SELECT key FROM idem_outbox_keys ORDER BY key`)
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"b", "c", "d"}, keys, "a key's row goes with its newest message")

	b.append(t, kept)
	require.EqualValues(t, 1, b.get(t, kept.ID).Seq, "a key that had no message left starts again")
}

func TestParseSnapshot(t *testing.T) {
	t.Parallel()
	s, err := store.ParseSnapshot("10:20:12,15")
	require.NoError(t, err)
	require.Equal(t, store.Snapshot{Xmin: 10, Xmax: 20, Xip: []uint64{12, 15}}, s)
	require.True(t, s.InProgress(12))
	require.True(t, s.InProgress(20))
	require.False(t, s.InProgress(13))
	s, err = store.ParseSnapshot("10:10:")
	require.NoError(t, err)
	require.Empty(t, s.Xip)
	for _, bad := range []string{"", "1:2", "a:2:", "1:2:x"} {
		_, err := store.ParseSnapshot(bad)
		require.Error(t, err, bad)
	}
}

// getPosOf reads a message's position in tx, which can see it before its COMMIT.
func (b *testBundle) getPosOf(t *testing.T, tx pgx.Tx, id [16]byte) int64 {
	t.Helper()
	r, err := b.st.OutboxGet(b.ctx, tx, id)
	require.NoError(t, err)
	return r.Pos
}

// TestOutboxSchemaQualified runs every outbox statement against tables in a schema that needs
// quoting, with none in the default one: a statement that forgot to qualify a table fails.
func TestOutboxSchemaQualified(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const schema = "Tenant-7"
	require.NoError(t, idem.MigrateTo(b.ctx, b.pool, 0))
	require.NoError(t, idem.Migrate(b.ctx, b.pool, idem.Schema(schema)))
	st := store.For(schema)
	ctx, pool := b.ctx, b.pool
	for _, msgs := range [][]store.OutboxMessage{{msg("k")}, {msg("")}, {msg("k"), msg("")}} {
		stmt, err := st.OutboxAppend(msgs)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, stmt.SQL, stmt.Args...)
		require.NoError(t, err)
	}
	_, snap, err := st.OutboxStart(ctx, pool)
	require.NoError(t, err)
	f, err := st.OutboxFetch(ctx, pool, store.OutboxFetchParams{Limit: 10, Lanes: 1, Live: []int32{0}, Owned: []int32{0}, From: snap.Xmax})
	require.NoError(t, err)
	require.Len(t, f.New, 4)
	_, _, err = st.OutboxCatchUp(ctx, pool, 0, 100, 10, 1, []int32{0})
	require.NoError(t, err)
	n, err := st.OutboxLanesInit(ctx, pool, 1)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = st.OutboxHeartbeat(ctx, pool, "me", time.Minute.Microseconds())
	require.NoError(t, err)
	got, err := st.OutboxAcquire(ctx, pool, "me", time.Minute.Microseconds(), 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	held := []store.LaneToken{got[0].LaneToken}
	_, written, err := st.OutboxWriteAll(ctx, pool, held, []store.OutboxWrite{{ID: f.New[0].ID, Lane: 0, Attempts: 1, Status: "stopped"}})
	require.NoError(t, err)
	require.EqualValues(t, 1, written)
	_, err = st.OutboxSetStatus(ctx, pool, f.New[0].ID, "", []string{"stopped"})
	require.NoError(t, err)
	_, err = st.OutboxRenew(ctx, pool, "me", held, time.Minute.Microseconds())
	require.NoError(t, err)
	_, err = st.OutboxGet(ctx, pool, f.New[0].ID)
	require.NoError(t, err)
	for _, status := range []string{"attention", "pending", "published", "all", "dead"} {
		_, err = st.OutboxList(ctx, pool, store.OutboxListParams{Status: status, Limit: 10})
		require.NoError(t, err, status)
	}
	_, err = st.OutboxLanes(ctx, pool)
	require.NoError(t, err)
	_, err = st.OutboxCounts(ctx, pool)
	require.NoError(t, err)
	require.NoError(t, st.OutboxRelease(ctx, pool, "me", held))
	require.NoError(t, st.OutboxLeave(ctx, pool, "me"))
	_, _, err = st.ReapOutbox(ctx, pool, 10, time.Hour.Microseconds(), nil)
	require.NoError(t, err)
}
