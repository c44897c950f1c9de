package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/tx"
)

// examplePool is a pool on a fresh database with idem's tables and an orders table. In your own
// examples and tests, idemtest gives the same: a throwaway, migrated Postgres.
func examplePool() *pgxpool.Pool {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(nil)
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text)`); err != nil {
		log.Fatal(err)
	}
	return pool
}

type Order struct {
	ID   int64  `json:"id"`
	Item string `json:"item"`
}

func placeOrder(item string) func(context.Context, pgx.Tx) (Order, error) {
	return func(ctx context.Context, t pgx.Tx) (Order, error) {
		o := Order{Item: item}
		err := t.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, item).Scan(&o.ID)
		return o, err
	}
}

func ExampleDo() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()

	key := idem.Key{Scope: "customer:42", ID: "order-7f3a", Fingerprint: idem.Fingerprint("book")}
	for attempt := 1; attempt <= 2; attempt++ {
		err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
			order, err := idem.Do(ctx, t, key, placeOrder("book"))
			if err == nil {
				fmt.Printf("attempt %d: order %d for a %s\n", attempt, order.ID, order.Item)
			}
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}

	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders placed:", n)
	// Output:
	// attempt 1: order 1 for a book
	// attempt 2: order 1 for a book
	// orders placed: 1
}

func ExampleRun() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()

	key := idem.Key{Scope: "customer:42", ID: "order-9b1c", Fingerprint: idem.Fingerprint("lamp")}
	first, _ := idem.Run(ctx, pool, key, placeOrder("lamp"))
	retry, _ := idem.Run(ctx, pool, key, placeOrder("lamp"))
	fmt.Println(first == retry, first.ID)

	// The same key for another request is refused, not answered with the lamp order.
	key.Fingerprint = idem.Fingerprint("sofa")
	_, err := idem.Run(ctx, pool, key, placeOrder("sofa"))
	fmt.Println(errors.Is(err, idem.ErrMismatch))
	// Output:
	// true 1
	// true
}

func ExampleFingerprint() {
	a := idem.Fingerprint("ab", "c")
	b := idem.Fingerprint("a", "bc")
	fmt.Println(len(a), string(a) == string(b))
	// Output: 32 false
}

func ExampleMigrate() {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(nil) // or pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	defer pool.Close()
	// Safe at every start, and from many processes at once.
	for range 2 {
		if err := idem.Migrate(ctx, pool, idem.Schema("idem")); err != nil {
			log.Fatal(err)
		}
	}
	var table string
	_ = pool.QueryRow(ctx, `SELECT to_regclass('idem.idem_keys')::text`).Scan(&table)
	fmt.Println(table)
	// Output: idem.idem_keys
}

func ExampleKey_Validate() {
	err := idem.Key{Scope: "customer:42", ID: "has space"}.Validate()
	fmt.Println(errors.Is(err, idem.ErrInvalidKey))
	fmt.Println(err)
	// Output:
	// true
	// idem: invalid key: ID has byte 0x20 at offset 3; only printable ASCII (0x21-0x7E, no spaces) is allowed
}
