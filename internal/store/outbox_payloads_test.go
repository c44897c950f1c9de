package store_test

import (
	"bytes"
	"crypto/rand"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// body is n random bytes: a body that compression cannot shrink, so that what is stored where
// is what the test says.
func body(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func msgOf(key string, n int) store.OutboxMessage {
	m := msg(key)
	m.Payload = body(n)
	return m
}

// today is the database's UTC day.
func (b *testBundle) today(t *testing.T) time.Time {
	t.Helper()
	var d time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&d))
	return d
}

// bodies counts the rows of idem_outbox whose body is in a partition, the rows of the partition
// of day, and those of the whole partitioned table.
func (b *testBundle) bodies(t *testing.T, day time.Time) (outside, inDay, all int) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
	(SELECT count(*) FROM idem_outbox WHERE payload IS NULL AND payload_day IS NOT NULL),
	(SELECT count(*) FROM idem_outbox_payloads WHERE day = $1),
	(SELECT count(*) FROM idem_outbox_payloads)`, day).Scan(&outside, &inDay, &all))
	return outside, inDay, all
}

// partitions lists the tables attached to idem_outbox_payloads, and counts the tables named like
// its partitions, attached or not.
func (b *testBundle) partitions(t *testing.T) (attached []string, named int) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'idem_outbox_payloads'::regclass ORDER BY 1`)
	require.NoError(t, err)
	attached, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_class WHERE relkind = 'r' AND relname ~ '^idem_outbox_payloads_p[0-9]{8}$'`).Scan(&named))
	return attached, named
}

// dropPartition drops day's partition of idem_outbox_payloads by hand.
func (b *testBundle) dropPartition(t *testing.T, day time.Time) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `DROP TABLE `+store.PartitionName("idem_outbox_payloads", day))
	require.NoError(t, err)
}

// pastMessage writes, with plain SQL, an unkeyed message appended on a past day with its body in
// that day's partition (made if missing), as Append would have left it on that day.
func (b *testBundle) pastMessage(t *testing.T, day time.Time, data []byte) [16]byte {
	t.Helper()
	require.NoError(t, b.st.MakePartitions(b.ctx, b.pool, "idem_outbox_payloads", day, day))
	id := idAt(day.Add(12 * time.Hour))
	_, err := b.pool.Exec(b.ctx, `WITH m AS (
	INSERT INTO idem_outbox (id, topic, key, hash, payload, payload_day, created_at) VALUES ($1, 't', '', 7, NULL, $2::date, $2::date::timestamp AT TIME ZONE 'UTC' + interval '12 hours')
)
INSERT INTO idem_outbox_payloads (day, id, data) VALUES ($2::date, $1, $3)`, id, day, data)
	require.NoError(t, err)
	return id
}

func TestOutboxLargeBodies(t *testing.T) {
	t.Parallel()

	t.Run("ToTodaysPartitionAndBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		today := b.today(t)
		edge, over := msgOf("a", store.PayloadInlineMax), msgOf("a", store.PayloadInlineMax+1)
		keyed, unkeyed := msgOf("a", 4<<10), msgOf("", 64<<10)
		batch := []store.OutboxMessage{msgOf("b", 16), msgOf("a", 4<<10), msgOf("", 64<<10), msgOf("", 16), msgOf("b", 64<<10), msgOf("a", 16)}
		b.append(t, edge)
		b.append(t, over)
		b.append(t, keyed)
		b.append(t, unkeyed)
		b.append(t, batch...)
		all := append([]store.OutboxMessage{edge, over, keyed, unkeyed}, batch...)

		outside, inDay, total := b.bodies(t, today)
		require.Equal(t, 6, outside, "the bodies over 1 KiB left their rows")
		require.Equal(t, 6, inDay, "for today's partition")
		require.Equal(t, 6, total)
		var inline int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_outbox WHERE payload IS NOT NULL AND payload_day IS NULL`).Scan(&inline))
		require.Equal(t, 4, inline, "1 KiB and less stay inline")

		f := b.fetch(t, store.OutboxFetchParams{})
		require.Len(t, f.New, len(all))
		seqs := map[string]int64{}
		for i, r := range f.New {
			require.Equal(t, all[i].ID, r.ID, "position order")
			require.True(t, bytes.Equal(all[i].Payload, r.Payload), "message %d: the body read back is the one written", i)
			require.Equal(t, len(all[i].Payload) > store.PayloadInlineMax, r.PayloadDay != nil, "message %d", i)
			if r.Key != "" {
				seqs[r.Key]++
				require.Equal(t, seqs[r.Key], r.Seq, "message %d: the key's next number", i)
			}
		}
		rows, now, err := b.st.OutboxCatchUp(b.ctx, b.pool, 0, f.MaxPos, 100, 1, []int32{0})
		require.NoError(t, err)
		require.NotZero(t, now)
		require.Len(t, rows, len(all))
		for i, r := range rows {
			require.True(t, bytes.Equal(all[i].Payload, r.Payload), "catch-up, message %d", i)
		}
		for _, m := range all {
			require.True(t, bytes.Equal(m.Payload, b.get(t, m.ID).Payload))
		}
		page, err := b.st.OutboxList(b.ctx, b.pool, store.OutboxListParams{Status: "all", Limit: 100})
		require.NoError(t, err)
		require.Len(t, page, len(all))
		for i, r := range page {
			require.True(t, bytes.Equal(all[i].Payload, r.Payload), "list, message %d", i)
		}

		// In a transaction, the bodies of a message it wrote are read in it.
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		mine := msgOf("c", 8<<10)
		b.appendTx(t, tx, mine)
		r, err := b.st.OutboxGet(b.ctx, tx, mine.ID)
		require.NoError(t, err)
		require.True(t, bytes.Equal(mine.Payload, r.Payload))
	})

	t.Run("InlineWithoutAPartition", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		today := b.today(t)
		b.dropPartition(t, today)
		msgs := []store.OutboxMessage{msgOf("a", 4<<10), msgOf("", 64<<10)}
		b.append(t, msgs[0])
		b.append(t, msgs[1])
		batch := []store.OutboxMessage{msgOf("a", 4<<10), msgOf("", 64<<10), msgOf("a", 16)}
		b.append(t, batch...)
		outside, _, _ := b.bodies(t, today)
		require.Zero(t, outside, "no partition for today: every body stays in its row")
		f := b.fetch(t, store.OutboxFetchParams{})
		want := append(msgs[:2:2], batch...)
		require.Len(t, f.New, len(want))
		for i, r := range f.New {
			require.Nil(t, r.PayloadDay)
			require.True(t, bytes.Equal(want[i].Payload, r.Payload), "message %d", i)
		}

		// Once the partition is made, the next large body goes there.
		made, err := b.st.CreatePartitions(b.ctx, b.pool)
		require.NoError(t, err)
		require.Contains(t, made, `"`+store.PartitionName("idem_outbox_payloads", today)+`"`)
		b.append(t, msgOf("a", 4<<10))
		outside, inDay, _ := b.bodies(t, today)
		require.Equal(t, 1, outside)
		require.Equal(t, 1, inDay)
	})

	t.Run("MissingBody", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		day := b.today(t).AddDate(0, 0, -9)
		id := b.pastMessage(t, day, body(4<<10))
		require.Len(t, b.get(t, id).Payload, 4<<10)
		b.dropPartition(t, day)
		// The relay refuses to go on without it rather than publish an empty message ...
		_, err := b.st.OutboxFetch(b.ctx, b.pool, store.OutboxFetchParams{Lanes: 1, Live: []int32{0}, Owned: []int32{0}, Limit: 10})
		require.ErrorContains(t, err, "is missing from")
		_, _, err = b.st.OutboxCatchUp(b.ctx, b.pool, 0, 1000, 10, 1, []int32{0})
		require.ErrorContains(t, err, "is missing from")
		// ... while an operator's read shows the message without it.
		r := b.get(t, id)
		require.Nil(t, r.Payload)
		require.NotNil(t, r.PayloadDay)
	})
}

func TestOutboxPayloadPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	today := b.today(t)
	published, dead, late := today.AddDate(0, 0, -5), today.AddDate(0, 0, -6), today.AddDate(0, 0, -7)
	name := func(d time.Time) string { return store.PartitionName("idem_outbox_payloads", d) }

	// Migrate made yesterday's, today's and two more days'.
	attached, _ := b.partitions(t)
	require.Equal(t, []string{name(today.AddDate(0, 0, -1)), name(today), name(today.AddDate(0, 0, 1)), name(today.AddDate(0, 0, 2))}, attached)

	p1, p2 := b.pastMessage(t, published, body(4<<10)), b.pastMessage(t, published, body(64<<10))
	d1 := b.pastMessage(t, dead, body(4<<10))
	l1 := b.pastMessage(t, late, body(4<<10))
	_, err := b.pool.Exec(b.ctx, `UPDATE idem_outbox SET published_at = now() - interval '2 hours' WHERE id = ANY($1)`, []uuid.UUID{p1, p2})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE idem_outbox SET status = 'dead' WHERE id = $1`, d1)
	require.NoError(t, err)
	// A table of the late day left detached by a drop that did not finish, while a message of
	// that day committed: it must come back, not go.
	_, err = b.pool.Exec(b.ctx, `ALTER TABLE idem_outbox_payloads DETACH PARTITION `+name(late))
	require.NoError(t, err)

	rep, err := b.st.MaintainPartitions(b.ctx, b.pool)
	require.NoError(t, err)
	require.Empty(t, rep.Dropped, "every past day still has messages")
	attached, named := b.partitions(t)
	require.Contains(t, attached, name(published))
	require.Contains(t, attached, name(dead))
	require.Contains(t, attached, name(late), "attached again")
	require.Equal(t, 7, named)
	require.Len(t, b.get(t, l1).Payload, 4<<10)

	n, _, err := b.st.ReapOutbox(b.ctx, b.pool, 100, time.Hour.Microseconds(), nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the published messages")
	rep, err = b.st.MaintainPartitions(b.ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []string{`"` + name(published) + `"`}, rep.Dropped, "the published day goes; the dead-lettered and the pending ones stay")
	attached, named = b.partitions(t)
	require.NotContains(t, attached, name(published))
	require.Contains(t, attached, name(dead))
	require.Equal(t, 6, named)
	var left int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_outbox_payloads WHERE day = $1`, dead).Scan(&left))
	require.Equal(t, 1, left)
	require.Len(t, b.get(t, d1).Payload, 4<<10)

	// The dead letter skipped, and reaped after the retention: its day goes too.
	_, err = b.st.OutboxLanesInit(b.ctx, b.pool, 1)
	require.NoError(t, err)
	ok, err := b.st.OutboxSetStatus(b.ctx, b.pool, d1, "skipped", []string{"dead"})
	require.NoError(t, err)
	require.True(t, ok)
	n, _, err = b.st.ReapOutbox(b.ctx, b.pool, 100, time.Hour.Microseconds(), nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "skipped, and appended long enough ago")
	rep, err = b.st.MaintainPartitions(b.ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []string{`"` + name(dead) + `"`}, rep.Dropped)
	_, named = b.partitions(t)
	require.Equal(t, 5, named)

	// The droppable rule is one probe of the partial index.
	rows, err := b.pool.Query(b.ctx, `EXPLAIN SELECT NOT EXISTS (SELECT FROM idem_outbox WHERE payload_day = $1::date)`, late)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(lines, "\n"), "idem_outbox_payload_day")
}

// TestOutboxAppendWhileAttaching appends large bodies from several writers while today's
// partition is made again and again: an Append never fails for it, and each body is read back
// whole, from its row or from the partition.
func TestOutboxAppendWhileAttaching(t *testing.T) {
	t.Parallel()
	b := setup(t)
	today := b.today(t)
	deadline := time.Now().Add(3 * time.Second)
	type written struct {
		id   [16]byte
		data []byte
	}
	results := make(chan []written, 4)
	errs := make(chan error, 4)
	// Writers pause while the partition is taken away (a DROP waits for, and can deadlock with,
	// a writer of the partition; the reaper never drops today's), not while it is made.
	var dropping sync.RWMutex
	for w := range 4 {
		go func() {
			var out []written
			defer func() { results <- out }()
			for i := 0; time.Now().Before(deadline); i++ {
				m := msgOf("k"+strconv.Itoa(w), 2<<10)
				msgs := []store.OutboxMessage{m}
				if i%2 == 1 {
					msgs = append(msgs, msgOf("", 16), msgOf("", 4<<10))
				}
				stmt, err := b.st.OutboxAppend(msgs)
				dropping.RLock()
				if err == nil {
					_, err = b.pool.Exec(b.ctx, stmt.SQL, stmt.Args...)
				}
				dropping.RUnlock()
				if err != nil {
					errs <- err
					return
				}
				for _, m := range msgs {
					out = append(out, written{m.ID, m.Payload})
				}
			}
		}()
	}
	rounds := 0
	for time.Now().Before(deadline) {
		// Take today's partition away with its bodies moved back inline, then make it again
		// while the writers go on.
		dropping.Lock()
		_, err := b.pool.Exec(b.ctx, `UPDATE idem_outbox o SET payload = p.data, payload_day = NULL
FROM idem_outbox_payloads p WHERE p.day = o.payload_day AND p.id = o.id`)
		if err == nil {
			_, err = b.pool.Exec(b.ctx, `DROP TABLE IF EXISTS `+store.PartitionName("idem_outbox_payloads", today))
		}
		dropping.Unlock()
		require.NoError(t, err)
		_, err = b.st.CreatePartitions(b.ctx, b.pool)
		require.NoError(t, err)
		rounds++
		time.Sleep(20 * time.Millisecond)
	}
	var all []written
	for range 4 {
		all = append(all, <-results...)
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err, "an Append failed while the partition was made")
	}
	require.Greater(t, rounds, 3)
	require.NotEmpty(t, all)
	for _, w := range all {
		require.True(t, bytes.Equal(w.data, b.get(t, w.id).Payload))
	}
	t.Logf("%d messages over %d rounds", len(all), rounds)
}
