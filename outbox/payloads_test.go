package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/tx"
)

// bodySink is a publisher that records each message's body beside the ledger.
type bodySink struct {
	b      *testBundle
	mu     sync.Mutex
	bodies map[uuid.UUID][]byte
}

func (b *testBundle) bodySink() *bodySink { return &bodySink{b: b, bodies: map[uuid.UUID][]byte{}} }

func (s *bodySink) Publish(_ context.Context, batch []*outbox.Envelope) []error {
	var errs []error
	for i, e := range batch {
		if e.Topic == "poison" {
			if errs == nil {
				errs = make([]error, len(batch))
			}
			errs[i] = errors.New("refused")
			continue
		}
		s.mu.Lock()
		s.bodies[e.ID] = bytes.Clone(e.Payload)
		s.mu.Unlock()
		s.b.ledger.RecordEnvelope(e)
	}
	return errs
}

func (s *bodySink) body(id uuid.UUID) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bodies[id]
}

func randomBody(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// writeMixed appends, from 4 writers at once, messages with bodies of 16 B, 4 KiB and 64 KiB over
// three keys and none, one at a time (keyed and unkeyed) and in batches, and returns what it
// wrote by id.
func (b *testBundle) writeMixed(t *testing.T) (ids []uuid.UUID, sent map[uuid.UUID][]byte) {
	t.Helper()
	sizes := []int{16, 4 << 10, 64 << 10}
	var mu sync.Mutex
	sent = map[uuid.UUID][]byte{}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	write := func(w int) error {
		for i := range 6 {
			msg := func(j int) outbox.Message {
				m := outbox.Message{Topic: "t", Payload: randomBody(sizes[(w+i+j)%3])}
				if (i+j)%4 != 3 {
					m.Key = "k" + strconv.Itoa((w+j)%3)
				}
				return m
			}
			var (
				got  []uuid.UUID
				msgs []outbox.Message
			)
			err := tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
				got, msgs = nil, nil
				if i%2 == 0 {
					msgs = []outbox.Message{msg(0), msg(1), msg(2), msg(3)}
					var err error
					got, err = outbox.AppendBatch(ctx, t, msgs)
					return err
				}
				for j := range 3 {
					m := msg(j)
					id, err := outbox.Append(ctx, t, m)
					if err != nil {
						return err
					}
					got, msgs = append(got, id), append(msgs, m)
				}
				return nil
			})
			if err != nil {
				return err
			}
			mu.Lock()
			for k, id := range got {
				ids, sent[id] = append(ids, id), msgs[k].Payload
			}
			mu.Unlock()
		}
		return nil
	}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- write(w)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return ids, sent
}

// bodiesOut counts the messages whose body is in a partition.
func (b *testBundle) bodiesOut(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_outbox WHERE payload IS NULL AND payload_day IS NOT NULL`).Scan(&n))
	return n
}

func (b *testBundle) dbToday(t *testing.T) time.Time {
	t.Helper()
	var d time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&d))
	return d
}

// partitionCount counts the tables named like day's partition of idem_outbox_payloads, and
// those attached to it.
func (b *testBundle) partitionCount(t *testing.T, day time.Time) (named, attached int) {
	t.Helper()
	name := store.PartitionName("idem_outbox_payloads", day)
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
	(SELECT count(*) FROM pg_class WHERE relname = $1),
	(SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relname = $1 AND i.inhparent = 'idem_outbox_payloads'::regclass)`,
		name).Scan(&named, &attached))
	return named, attached
}

// checkBodies requires every message published with the body it was appended with, and shown
// with it by Get and List.
func (b *testBundle) checkBodies(t *testing.T, sink *bodySink, sent map[uuid.UUID][]byte) {
	t.Helper()
	for id, want := range sent {
		require.True(t, bytes.Equal(want, sink.body(id)), "message %s (%d bytes) published as written", id, len(want))
		info, err := outbox.Get(b.ctx, b.pool, id)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, info.Payload), "Get shows message %s's body", id)
	}
	seen := 0
	for after := int64(0); ; {
		page, err := outbox.List(b.ctx, b.pool, &outbox.ListParams{Status: "all", After: after, Limit: 50})
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, m := range page {
			if want, ok := sent[m.ID]; ok {
				require.True(t, bytes.Equal(want, m.Payload), "List shows message %s's body", m.ID)
				seen++
			}
		}
		after = page[len(page)-1].Position
	}
	require.Equal(t, len(sent), seen)
}

func TestLargeBodies(t *testing.T) {
	t.Parallel()

	// Bodies of 4 KiB and 64 KiB go to today's partition and are published byte for byte, in
	// each key's order among small ones.
	t.Run("PublishedAsWritten", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sink := b.bodySink()
		b.run(t, sink, b.opts("r1"))
		ids, sent := b.writeMixed(t)
		large := 0
		for _, p := range sent {
			if len(p) > store.PayloadInlineMax {
				large++
			}
		}
		require.Greater(t, large, 20)
		b.waitPublished(t, int64(len(ids)))
		b.checkLedger(t, ids)
		b.checkBodies(t, sink, sent)
		require.Equal(t, large, b.bodiesOut(t), "every large body is in a partition")
		var inToday int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+store.PartitionName("idem_outbox_payloads", b.dbToday(t))).Scan(&inToday))
		require.Equal(t, large, inToday, "today's")
	})

	// With no partition for today, large bodies stay in their rows and are published all the
	// same.
	t.Run("InlineWithoutAPartition", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(b.ctx, `DROP TABLE `+store.PartitionName("idem_outbox_payloads", b.dbToday(t)))
		require.NoError(t, err)
		sink := b.bodySink()
		b.run(t, sink, b.opts("r1"))
		ids, sent := b.writeMixed(t)
		b.waitPublished(t, int64(len(ids)))
		b.checkLedger(t, ids)
		b.checkBodies(t, sink, sent)
		require.Zero(t, b.bodiesOut(t))
	})

	// The reaper drops a past day's partition once its messages are published and reaped, and
	// keeps the partition of a day with a dead-lettered message until an operator skips it.
	t.Run("ReaperDropsPastDays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		today := b.dbToday(t)
		published, dead := today.AddDate(0, 0, -3), today.AddDate(0, 0, -4)
		sent := map[uuid.UUID][]byte{}
		past := func(day time.Time, topic string, data []byte) uuid.UUID {
			require.NoError(t, store.For("").MakePartitions(b.ctx, b.pool, "idem_outbox_payloads", day, day))
			id := uuid.Must(uuid.NewV7())
			// As Append would have written it that day.
			_, err := b.pool.Exec(b.ctx, `WITH m AS (
	INSERT INTO idem_outbox (id, topic, key, hash, payload, payload_day, created_at)
	VALUES ($1, $2, '', 1, NULL, $3::date, $3::date::timestamp AT TIME ZONE 'UTC' + interval '12 hours')
)
INSERT INTO idem_outbox_payloads (day, id, data) VALUES ($3::date, $1, $4)`, id, topic, day, data)
			require.NoError(t, err)
			sent[id] = data
			return id
		}
		past(published, "t", randomBody(4<<10))
		past(published, "t", randomBody(64<<10))
		poisoned := past(dead, "poison", randomBody(4<<10))
		require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(t pgx.Tx) error {
			_, err := outbox.Append(b.ctx, t, outbox.Message{Topic: "t", Key: "k", Payload: randomBody(4 << 10)})
			return err
		}))

		sink := b.bodySink()
		opts := b.opts("r1")
		opts.Failure.MaxAttempts, opts.Failure.DeadLetter = 1, true
		b.run(t, sink, opts)
		b.waitPublished(t, 3)
		waitFor(t, 10*time.Second, "the poisoned message to be dead-lettered", func() bool { return b.counts(t)[outbox.StatusDead] == 1 })
		for id, data := range sent {
			if id != poisoned {
				require.True(t, bytes.Equal(data, sink.body(id)), "a past day's body, read from its partition, published as written")
			}
		}

		time.Sleep(1100 * time.Millisecond)
		n, err := idem.Reap(b.ctx, b.pool, idem.OutboxRetention(time.Second))
		require.NoError(t, err)
		require.EqualValues(t, 3, n, "the published messages")
		named, attached := b.partitionCount(t, published)
		require.Zero(t, named, "the published day's partition was dropped")
		require.Zero(t, attached)
		named, attached = b.partitionCount(t, dead)
		require.Equal(t, 1, named, "a dead-lettered message keeps its day's partition")
		require.Equal(t, 1, attached)
		_, attached = b.partitionCount(t, today)
		require.Equal(t, 1, attached, "today's stays whatever it holds")
		var rows, bodies int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM idem_outbox), (SELECT count(*) FROM idem_outbox_payloads WHERE day = $1)`, dead).Scan(&rows, &bodies))
		require.Equal(t, 1, rows)
		require.Equal(t, 1, bodies)
		info, err := outbox.Get(b.ctx, b.pool, poisoned)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDead, info.Status)
		require.True(t, bytes.Equal(sent[poisoned], info.Payload))

		// Reaped again while still dead-lettered: kept.
		_, err = idem.Reap(b.ctx, b.pool, idem.OutboxRetention(time.Second))
		require.NoError(t, err)
		named, _ = b.partitionCount(t, dead)
		require.Equal(t, 1, named)

		// Skipped (appended days ago, so past the retention at once): the message and its day go.
		require.NoError(t, outbox.Skip(b.ctx, b.pool, poisoned))
		n, err = idem.Reap(b.ctx, b.pool, idem.OutboxRetention(time.Second))
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		named, _ = b.partitionCount(t, dead)
		require.Zero(t, named)
		require.Empty(t, b.counts(t))
	})

	// Migrating down puts every body back into its row.
	t.Run("MigrateDownKeepsBodies", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, sent := b.writeMixed(t)
		require.NotZero(t, b.bodiesOut(t))
		require.NoError(t, idem.MigrateTo(b.ctx, b.pool, 10))
		for _, id := range ids {
			var p []byte
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT payload FROM idem_outbox WHERE id = $1`, id).Scan(&p))
			require.True(t, bytes.Equal(sent[id], p), "message %s", id)
		}
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'idem\_outbox\_payloads%'`).Scan(&n))
		require.Zero(t, n)
		require.NoError(t, idem.Migrate(b.ctx, b.pool))
		sink := b.bodySink()
		b.run(t, sink, b.opts("r1"))
		b.waitPublished(t, int64(len(ids)))
		b.checkBodies(t, sink, sent)
	})
}
