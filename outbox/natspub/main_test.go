package natspub_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/outboxcheck"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/natspub"
	"github.com/idemkit/idem/outbox/natspub/natstest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(idemtest.Main(m))
}

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	nats   *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	ledger *outboxcheck.Ledger
}

// setup gives a test a database, a NATS server with a stream OUTBOX on "events.>", and a
// connection that reconnects for as long as the test runs.
func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), pool: idemtest.NewPool(t, nil), nats: natstest.New(t), ledger: outboxcheck.NewLedger()}
	var err error
	b.nc, err = nats.Connect(b.nats.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(b.nc.Close)
	b.js, err = jetstream.New(b.nc)
	require.NoError(t, err)
	b.stream, err = b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "OUTBOX", Subjects: []string{"events.>"}, Duplicates: 2 * time.Minute})
	require.NoError(t, err)
	return b
}

// relay runs a relay publishing to b's JetStream until the test ends.
func (b *testBundle) relay(t *testing.T, name string) {
	t.Helper()
	relay, err := outbox.NewRelay(b.pool, natspub.New(b.js, nil), &outbox.RelayOpts{
		Name: name, Lease: 2 * time.Second, PollInterval: 20 * time.Millisecond, PublishTimeout: 5 * time.Second,
		Failure: &outbox.FailurePolicy{MaxAttempts: 3, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
		Logger:  slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("relay: %v", err)
		}
	})
}

// consume reads the stream in order into the ledger until the test ends.
func (b *testBundle) consume(t *testing.T) {
	t.Helper()
	c, err := b.stream.OrderedConsumer(b.ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	cc, err := c.Consume(func(m jetstream.Msg) {
		h := m.Headers()
		seq, _ := strconv.ParseInt(h.Get(outbox.HeaderSeq), 10, 64)
		b.ledger.Record(outboxcheck.Delivery{ID: h.Get(jetstream.MsgIDHeader), Key: h.Get(outbox.HeaderKey), Seq: seq})
	})
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
}

// streamCount is how many messages the stream holds.
func (b *testBundle) streamCount(t *testing.T) uint64 {
	t.Helper()
	info, err := b.stream.Info(b.ctx)
	require.NoError(t, err)
	return info.State.Msgs
}

// waitFor polls cond until it holds, for at most limit.
var waitFor = outboxcheck.WaitFor

// waitPublished waits until n messages are published by the database's count.
func (b *testBundle) waitPublished(t *testing.T, n int64, limit time.Duration) {
	t.Helper()
	waitFor(t, limit, strconv.FormatInt(n, 10)+" messages to be published", func() bool {
		c, err := outbox.Counts(b.ctx, b.pool)
		require.NoError(t, err)
		return c[outbox.StatusPublished] >= n
	})
}

// writers append n messages from w in goroutines at once, and return the committed ids.
func writers(t *testing.T, ctx context.Context, w *outboxcheck.Writer, goroutines, n int) []uuid.UUID {
	t.Helper()
	var (
		mu  sync.Mutex
		out []uuid.UUID
		wg  sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			ids, err := w.Write(ctx, n/goroutines)
			if err != nil {
				t.Errorf("writer: %v", err)
			}
			mu.Lock()
			out = append(out, ids...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

func newPool(ctx context.Context, url string) (*pgxpool.Pool, error) { return pgxpool.New(ctx, url) }
