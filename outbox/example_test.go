package outbox_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/tx"
)

// Example appends two messages of one key inside idem.Do, in the transaction that does the
// work, and relays them with a PublisherFunc (a stand-in for a broker; see outbox/natspub,
// outbox/amqppub and outbox/kafkapub for real ones). They are published in commit order, each
// after the one before was acknowledged.
func Example() {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(nil)

	for _, step := range []string{"placed", "paid"} {
		_, err := idem.Run(ctx, pool, idem.Key{Scope: "shop", ID: "order-42-" + step}, func(ctx context.Context, t pgx.Tx) (string, error) {
			// ... the order's own writes through t ...
			id, err := outbox.Append(ctx, t, outbox.Message{Topic: "order." + step, Key: "order-42", Payload: []byte(step)})
			return id.String(), err
		})
		if err != nil {
			panic(err)
		}
	}

	published := make(chan string, 2)
	relay, err := outbox.NewRelay(pool, outbox.PublisherFunc(func(ctx context.Context, e *outbox.Envelope) error {
		published <- fmt.Sprintf("%s key=%s seq=%d", e.Topic, e.Key, e.Seq)
		return nil // acknowledged
	}), &outbox.RelayOpts{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = relay.Run(ctx) }()
	for range 2 {
		fmt.Println(<-published)
	}
	// Output:
	// order.placed key=order-42 seq=1
	// order.paid key=order-42 seq=2
}

// ExampleAppendBatch appends a batch in a transaction of tx.Run: the INSERT goes with COMMIT,
// and the ids are known at once.
func ExampleAppendBatch() {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(nil)
	err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
		ids, err := outbox.AppendBatch(ctx, t, []outbox.Message{
			{Topic: "stock.reserved", Key: "sku-1", Payload: []byte("1")},
			{Topic: "stock.reserved", Key: "sku-2", Payload: []byte("1")},
		})
		fmt.Println(len(ids), "ids, version", ids[0].Version())
		return err
	})
	if err != nil {
		panic(err)
	}
	counts, _ := outbox.Counts(ctx, pool)
	fmt.Println(counts[outbox.StatusPending], "pending")
	// Output:
	// 2 ids, version VERSION_7
	// 2 pending
}
