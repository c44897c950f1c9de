package amqppub_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/amqppub"
	"github.com/idemkit/idem/outbox/amqppub/amqptest"
	"github.com/idemkit/idem/tx"
)

// Example relays an order.placed message to a RabbitMQ queue and consumes it through an inbox,
// acknowledging the delivery only after the inbox's COMMIT. RabbitMQ redelivers it (as after a
// consumer that died before its ack): the inbox acknowledges it without running the handler.
func Example() {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(nil)
	url := amqptest.ExampleURL() // or your broker's URL
	queue := "orders-" + uuid.NewString()
	conn, err := amqp.Dial(url)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	_, _ = ch.QueueDeclare(queue, true, false, false, false, nil)
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()
	_, _ = pool.Exec(ctx, `CREATE TABLE shipments (order_ref text)`)

	// The producer appends in its transaction; the default exchange routes by queue name.
	err = tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
		_, err := outbox.Append(ctx, t, outbox.Message{Topic: queue, Key: "order-7", Payload: []byte("order-7")})
		return err
	})
	if err != nil {
		panic(err)
	}
	pub := amqppub.New(func() (*amqp.Connection, error) { return amqp.Dial(url) }, nil)
	defer pub.Close()
	relay, _ := outbox.NewRelay(pool, pub, &outbox.RelayOpts{Logger: slog.New(slog.DiscardHandler)})
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	go func() { _ = relay.Run(relayCtx) }()

	// The consumer: manual acknowledgements, through the inbox.
	inbox, _ := outbox.NewInbox(pool, "shipping", nil)
	deliveries, _ := ch.Consume(queue, "", false, false, false, false, nil)
	for n := range 2 {
		var d amqp.Delivery
		select {
		case d = <-deliveries:
		case <-time.After(10 * time.Second):
			panic("no delivery")
		}
		ran, err := inbox.Handle(ctx, d.MessageId, func(ctx context.Context, t pgx.Tx) error {
			_, err := t.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, string(d.Body))
			return err
		})
		if err != nil {
			_ = d.Nack(false, true) // not recorded: deliver it again
			continue
		}
		fmt.Printf("delivery %d: handled now: %t\n", n+1, ran)
		if n == 0 {
			_ = d.Nack(false, true) // as if the consumer died before its ack: redelivered
			continue
		}
		_ = d.Ack(false)
	}
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&rows)
	fmt.Println("shipments:", rows)
	// Output:
	// delivery 1: handled now: true
	// delivery 2: handled now: false
	// shipments: 1
}
