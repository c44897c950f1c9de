package idemtest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/tx"
)

// A runnable example gets its database from NewExamplePool; the TestMain of its package calls
// idemtest.Main, which drops the database afterwards.
func ExampleNewExamplePool() {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(nil)
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}

	key := idem.Key{Scope: "customer:42", ID: "order-1"}
	for range 2 {
		var id int64
		err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
			var err error
			id, err = idem.Do(ctx, t, key, func(ctx context.Context, t pgx.Tx) (int64, error) {
				var id int64
				err := t.QueryRow(ctx, `INSERT INTO orders DEFAULT VALUES RETURNING id`).Scan(&id)
				return id, err
			})
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("order", id)
	}
	// Output:
	// order 1
	// order 1
}
