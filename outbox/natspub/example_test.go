package natspub_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/natspub"
	"github.com/idemkit/idem/outbox/natspub/natstest"
	"github.com/idemkit/idem/tx"
)

// Example shows both sides: a transaction appends transfer.completed, a relay publishes it to
// JetStream, and a consumer (a durable pull consumer) records it through an inbox, acknowledging
// JetStream only after the inbox's COMMIT. JetStream delivers the message a second time (as
// after a consumer that died before its Ack): the inbox acknowledges it without running the
// handler.
func Example() {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(nil)
	dir, _ := os.MkdirTemp("", "example-nats-")
	defer os.RemoveAll(dir)
	srv, err := natstest.Start(dir) // or nats.Connect(your server's URL)
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BANK", Subjects: []string{"transfer.>"}, Duplicates: 10 * time.Minute})
	if err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE ledger (ref text, amount bigint)`)

	// The producer: the event commits with the transfer, or not at all.
	err = tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
		// ... the transfer's own writes through t ...
		_, err := outbox.Append(ctx, t, outbox.Message{Topic: "transfer.completed", Key: "account:1", Payload: []byte(`{"ref":"t-1","amount":100}`)})
		return err
	})
	if err != nil {
		panic(err)
	}

	// The relay, in the producer's process.
	relay, _ := outbox.NewRelay(pool, natspub.New(js, nil), &outbox.RelayOpts{Logger: slog.New(slog.DiscardHandler)})
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	go func() { _ = relay.Run(relayCtx) }()

	// The consumer, in another service.
	cons, _ := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	inbox, _ := outbox.NewInbox(pool, "ledger", nil)
	for delivery := range 2 {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			panic(err)
		}
		ran, err := inbox.Handle(ctx, msg.Headers().Get(jetstream.MsgIDHeader), func(ctx context.Context, t pgx.Tx) error {
			_, err := t.Exec(ctx, `INSERT INTO ledger SELECT d->>'ref', (d->>'amount')::bigint FROM (SELECT $1::jsonb d) x`, msg.Data())
			return err
		})
		if err != nil {
			_ = msg.NakWithDelay(time.Second) // not recorded: deliver it again later
			continue
		}
		fmt.Printf("delivery %d: handled now: %t\n", delivery+1, ran)
		if delivery == 0 {
			_ = msg.Nak() // as if the consumer died before its Ack: JetStream delivers it again
			continue
		}
		_ = msg.Ack()
	}
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows)
	fmt.Println("ledger rows:", rows)
	// Output:
	// delivery 1: handled now: true
	// delivery 2: handled now: false
	// ledger rows: 1
}
