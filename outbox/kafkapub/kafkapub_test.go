package kafkapub_test

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/outboxcheck"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
	"github.com/idemkit/idem/outbox/kafkapub/kafkatest"
)

func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func client(t *testing.T, seeds []string, opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func TestPublisher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seeds := kafkatest.Seeds(t, "events")
	pub := kafkapub.New(client(t, seeds, kgo.UnknownTopicRetries(1)), nil)
	e := &outbox.Envelope{ID: uuid.Must(uuid.NewV7()), Topic: "events", Key: "k", Seq: 4, Payload: []byte("p"),
		Headers: map[string]string{"Content-Type": "text/plain"}, Created: time.Now()}
	errs := pub.Publish(ctx, []*outbox.Envelope{e, {ID: uuid.Must(uuid.NewV7()), Topic: "no-such-topic", Payload: []byte("x")}})
	require.NoError(t, errs[0])
	require.Error(t, errs[1], "an unknown topic is refused")
	require.NotErrorIs(t, errs[1], outbox.ErrUnavailable)

	cons := client(t, seeds, kgo.ConsumeTopics("events"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	fs := cons.PollFetches(ctx)
	require.NoError(t, fs.Err())
	recs := fs.Records()
	require.Len(t, recs, 1)
	r := recs[0]
	require.Equal(t, "k", string(r.Key))
	require.Equal(t, []byte("p"), r.Value)
	require.Equal(t, e.ID.String(), header(r, outbox.HeaderID))
	require.Equal(t, "4", header(r, outbox.HeaderSeq))
	require.Equal(t, "text/plain", header(r, "Content-Type"))
}

// TestRelayToKafka relays messages over many keys to a topic of three partitions and consumes
// them: nothing lost, every key in order (a key stays in its partition).
func TestRelayToKafka(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seeds := kafkatest.Seeds(t, "orders")
	pool := idemtest.NewPool(t, nil)
	relay, err := outbox.NewRelay(pool, kafkapub.New(client(t, seeds), nil), &outbox.RelayOpts{Lease: 2 * time.Second,
		PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	defer func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	}()
	w := &outboxcheck.Writer{DB: pool, Topic: "orders", Keys: 50, PerTx: 5}
	ids, err := w.Write(ctx, 1000)
	require.NoError(t, err)

	ledger := outboxcheck.NewLedger()
	cons := client(t, seeds, kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	deadline := time.Now().Add(time.Minute)
	for ledger.Distinct() < len(ids) && time.Now().Before(deadline) {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		fs := cons.PollFetches(pctx)
		pcancel()
		fs.EachRecord(func(r *kgo.Record) {
			seq, _ := strconv.ParseInt(header(r, outbox.HeaderSeq), 10, 64)
			ledger.Record(outboxcheck.Delivery{ID: header(r, outbox.HeaderID), Key: string(r.Key), Seq: seq})
		})
	}
	r := ledger.Check(ids)
	require.True(t, r.OK(), r.String())
}
