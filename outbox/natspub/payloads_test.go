package natspub_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/outboxcheck"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/tx"
)

// TestLargeBodies relays bodies of 16 B, 4 KiB and 64 KiB, keyed and unkeyed, one at a time and
// in batches, to JetStream: the large ones leave their rows for the day's partition, and the
// stream holds every body as it was appended, each key in order.
func TestLargeBodies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		mu       sync.Mutex
		received = map[string][]byte{}
	)
	c, err := b.stream.OrderedConsumer(b.ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	cc, err := c.Consume(func(m jetstream.Msg) {
		h := m.Headers()
		seq, _ := strconv.ParseInt(h.Get(outbox.HeaderSeq), 10, 64)
		id := h.Get(jetstream.MsgIDHeader)
		mu.Lock()
		received[id] = bytes.Clone(m.Data())
		mu.Unlock()
		b.ledger.Record(outboxcheck.Delivery{ID: id, Key: h.Get(outbox.HeaderKey), Seq: seq})
	})
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	b.relay(t, "a")

	sizes := []int{16, 4 << 10, 64 << 10}
	sent := map[uuid.UUID][]byte{}
	var ids []uuid.UUID
	for i := range 30 {
		msg := func(j int) outbox.Message {
			p := make([]byte, sizes[(i+j)%3])
			_, _ = rand.Read(p)
			m := outbox.Message{Topic: "events.large", Payload: p}
			if (i+j)%4 != 3 {
				m.Key = "k" + strconv.Itoa((i+j)%3)
			}
			return m
		}
		var (
			got  []uuid.UUID
			msgs []outbox.Message
		)
		require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			if i%2 == 0 {
				msgs = []outbox.Message{msg(0), msg(1), msg(2), msg(3)}
				var err error
				got, err = outbox.AppendBatch(ctx, t, msgs)
				return err
			}
			msgs = []outbox.Message{msg(0)}
			id, err := outbox.Append(ctx, t, msgs[0])
			got = []uuid.UUID{id}
			return err
		}))
		for k, id := range got {
			sent[id] = msgs[k].Payload
			ids = append(ids, id)
		}
	}
	b.waitPublished(t, int64(len(ids)), time.Minute)
	waitFor(t, time.Minute, "the consumer to read them", func() bool { return b.ledger.Distinct() >= len(ids) })
	r := b.ledger.Check(ids)
	require.True(t, r.OK(), r.String())
	mu.Lock()
	defer mu.Unlock()
	large := 0
	for id, want := range sent {
		require.True(t, bytes.Equal(want, received[id.String()]), "message %s (%d bytes) as appended", id, len(want))
		if len(want) > 1024 {
			large++
		}
	}
	var out int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_outbox WHERE payload IS NULL AND payload_day IS NOT NULL`).Scan(&out))
	require.Equal(t, large, out, "the large bodies were in the day's partition")
	require.Greater(t, large, 20)
}
