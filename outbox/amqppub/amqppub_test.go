package amqppub_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/outboxcheck"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/amqppub"
	"github.com/idemkit/idem/outbox/amqppub/amqptest"
)

// TestMain drops the examples' databases and stops a broker amqptest started.
func TestMain(m *testing.M) {
	code := idemtest.Main(m)
	amqptest.Stop()
	os.Exit(code)
}

type testBundle struct {
	ctx   context.Context
	url   string
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string
}

// setup connects to a RabbitMQ and declares a durable queue of the test's own, which the default
// exchange routes messages to by its name.
func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), url: amqptest.URL(t), queue: "amqppub-test-" + uuid.NewString()}
	var err error
	b.conn, err = amqp.Dial(b.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.conn.Close() })
	b.ch, err = b.conn.Channel()
	require.NoError(t, err)
	_, err = b.ch.QueueDeclare(b.queue, true, false, false, false, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		ch, err := b.conn.Channel()
		if err == nil {
			_, _ = ch.QueueDelete(b.queue, false, false, false)
		}
	})
	return b
}

func (b *testBundle) publisher(t *testing.T) *amqppub.Publisher {
	pub := amqppub.New(func() (*amqp.Connection, error) { return amqp.Dial(b.url) }, nil)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func envelope(topic string) *outbox.Envelope {
	return &outbox.Envelope{ID: uuid.Must(uuid.NewV7()), Topic: topic, Key: "k", Seq: 3, Payload: []byte("p"),
		Headers: map[string]string{"Content-Type": "text/plain"}, Created: time.Now()}
}

func TestPublisher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub := b.publisher(t)
	e := envelope(b.queue)
	errs := pub.Publish(b.ctx, []*outbox.Envelope{e})
	require.NoError(t, errs[0])
	d, ok, err := b.ch.Get(b.queue, true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, e.ID.String(), d.MessageId)
	require.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
	require.Equal(t, "text/plain", d.ContentType)
	require.Equal(t, []byte("p"), d.Body)
	require.Equal(t, "k", d.Headers[outbox.HeaderKey])
	require.Equal(t, "3", d.Headers[outbox.HeaderSeq])
	require.Equal(t, e.ID.String(), d.Headers[outbox.HeaderID])

	// No queue for the routing key: mandatory brings it back, a failure, never a success.
	errs = pub.Publish(b.ctx, []*outbox.Envelope{envelope("no-such-queue-" + uuid.NewString()), envelope(b.queue)})
	require.ErrorContains(t, errs[0], "unroutable")
	require.NotErrorIs(t, errs[0], outbox.ErrUnavailable)
	require.NoError(t, errs[1])

	// An exchange that does not exist: the broker closes the channel over it; the next batch
	// gets a new one.
	missing := amqppub.New(func() (*amqp.Connection, error) { return amqp.Dial(b.url) },
		&amqppub.Opts{Route: func(topic string) (string, string) {
			if topic == "bad" {
				return "no-such-exchange-" + uuid.NewString(), topic
			}
			return "", topic
		}})
	defer missing.Close()
	errs = missing.Publish(b.ctx, []*outbox.Envelope{envelope("bad")})
	require.Error(t, errs[0])
	require.NotErrorIs(t, errs[0], outbox.ErrUnavailable)
	errs = missing.Publish(b.ctx, []*outbox.Envelope{envelope(b.queue)})
	require.NoError(t, errs[0])

	down := amqppub.New(func() (*amqp.Connection, error) { return nil, errors.New("connection refused") }, nil)
	require.ErrorIs(t, down.Publish(b.ctx, []*outbox.Envelope{e})[0], outbox.ErrUnavailable)
}

// TestRelayToRabbitMQ relays messages over many keys to a queue and consumes them through an
// inbox, acknowledging after its COMMIT: nothing lost, every key in order, each handled once.
func TestRelayToRabbitMQ(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := idemtest.NewPool(t, nil)
	_, err := pool.Exec(b.ctx, `CREATE TABLE handled (id text PRIMARY KEY)`)
	require.NoError(t, err)
	relay, err := outbox.NewRelay(pool, b.publisher(t), &outbox.RelayOpts{Lease: 2 * time.Second, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	}()

	w := &outboxcheck.Writer{DB: pool, Topic: b.queue, Keys: 50, PerTx: 5}
	ids, err := w.Write(b.ctx, 1000)
	require.NoError(t, err)

	ledger := outboxcheck.NewLedger()
	consume(t, b, pool, ledger, len(ids))
	r := ledger.Check(ids)
	require.True(t, r.OK(), r.String())
	var handled int
	require.NoError(t, pool.QueryRow(b.ctx, `SELECT count(*) FROM handled`).Scan(&handled))
	require.Equal(t, len(ids), handled)
}

// consume reads n distinct messages from the queue through an inbox, acknowledging each after
// the inbox's COMMIT.
func consume(t *testing.T, b *testBundle, pool *pgxpool.Pool, ledger *outboxcheck.Ledger, n int) {
	t.Helper()
	inbox, err := outbox.NewInbox(pool, "test", nil)
	require.NoError(t, err)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	deliveries, err := ch.Consume(b.queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	deadline := time.After(time.Minute)
	for ledger.Distinct() < n {
		select {
		case d := <-deliveries:
			_, err := inbox.Handle(b.ctx, d.MessageId, func(ctx context.Context, t pgx.Tx) error {
				_, err := t.Exec(ctx, `INSERT INTO handled VALUES ($1)`, d.MessageId)
				return err
			})
			require.NoError(t, err)
			seq, _ := strconv.ParseInt(fmt.Sprint(d.Headers[outbox.HeaderSeq]), 10, 64)
			ledger.Record(outboxcheck.Delivery{ID: d.MessageId, Key: fmt.Sprint(d.Headers[outbox.HeaderKey]), Seq: seq})
			require.NoError(t, d.Ack(false))
		case <-deadline:
			t.Fatalf("consumed %d of %d", ledger.Distinct(), n)
		}
	}
}

// TestStartInstalled starts the installed rabbitmq-server, as a machine without a broker running
// would, and publishes through it.
func TestStartInstalled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url, stop, err := amqptest.StartInstalled(ctx)
	require.NoError(t, err)
	defer stop()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	pub := amqppub.New(func() (*amqp.Connection, error) { return amqp.Dial(url) }, nil)
	defer pub.Close()
	require.NoError(t, pub.Publish(ctx, []*outbox.Envelope{envelope(q.Name)})[0])
}
