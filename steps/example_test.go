package steps_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// examplePool returns a pool on a fresh database with idem's tables and an orders table.
func examplePool(ctx context.Context) *pgxpool.Pool {
	pool := idemtest.NewExamplePool(nil)
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	return pool
}

// Tx commits the step's writes with its checkpoint; a replay returns the stored output and
// writes nothing.
func ExampleTx() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	order := workflow.Define("order", func(ctx context.Context, item string) (int64, error) {
		return steps.Tx(ctx, "insert", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, item).Scan(&id)
			return id, err
		}, nil)
	})
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{order}})
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		id, err := order.Run(ctx, engine, idem.Key{Scope: "shop", ID: "order-1"}, "book", nil)
		fmt.Println(id, err)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 1 <nil>
	// 1 <nil>
	// 1 <nil>
	// orders: 1
}

// Call hands the outside service a key that is the same on every attempt: here the first
// attempt fails, and the retry presents the same key.
func ExampleCall() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	var seen []string
	send := workflow.Define("send", func(ctx context.Context, to string) (string, error) {
		return steps.Call(ctx, "mail", func(ctx context.Context, key string) (string, error) {
			seen = append(seen, key)
			if len(seen) == 1 {
				return "", fmt.Errorf("mail server busy")
			}
			return "sent to " + to, nil
		}, &steps.Opts{MaxAttempts: 3})
	})
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{send}})
	if err != nil {
		log.Fatal(err)
	}
	out, err := send.Run(ctx, engine, idem.Key{Scope: "shop", ID: "mail-1"}, "ada@example.com", nil)
	fmt.Println(out, err)
	fmt.Println(len(seen), seen[0] == seen[1])
	// Output:
	// sent to ada@example.com <nil>
	// 2 true
}
