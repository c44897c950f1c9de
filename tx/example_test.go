package tx_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/tx"
)

// examplePool returns a pool on a fresh database with an accounts table.
// The caller closes it.
func examplePool(ctx context.Context) *pgxpool.Pool {
	pool := idemtest.NewExamplePool(nil)
	_, err := pool.Exec(ctx, `
		CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL CHECK (balance >= 0));
		INSERT INTO accounts VALUES ('alice', 100), ('bob', 0)`)
	if err != nil {
		log.Fatal(err)
	}
	return pool
}

func ExampleRun() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	// Under SERIALIZABLE, Postgres may abort the transfer to keep it
	// consistent with a concurrent one; Run then runs it again.
	transfer := func(ctx context.Context, dbtx pgx.Tx) error {
		if _, err := dbtx.Exec(ctx, "UPDATE accounts SET balance = balance - 30 WHERE id = 'alice'"); err != nil {
			return fmt.Errorf("error debiting: %w", err)
		}
		if _, err := dbtx.Exec(ctx, "UPDATE accounts SET balance = balance + 30 WHERE id = 'bob'"); err != nil {
			return fmt.Errorf("error crediting: %w", err)
		}
		return nil
	}
	if err := tx.Run(ctx, pool, transfer, tx.Isolation(pgx.Serializable)); err != nil {
		log.Fatal(err)
	}

	var alice, bob int
	if err := pool.QueryRow(ctx, "SELECT (SELECT balance FROM accounts WHERE id = 'alice'), (SELECT balance FROM accounts WHERE id = 'bob')").Scan(&alice, &bob); err != nil {
		log.Fatal(err)
	}
	fmt.Println("alice:", alice, "bob:", bob)

	// Output:
	// alice: 70 bob: 30
}

func ExampleRun_error() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	// An error from fn rolls back everything fn did, and comes back as is.
	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
		if _, err := dbtx.Exec(ctx, "UPDATE accounts SET balance = balance + 500 WHERE id = 'bob'"); err != nil {
			return err
		}
		_, err := dbtx.Exec(ctx, "UPDATE accounts SET balance = balance - 500 WHERE id = 'alice'")
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		fmt.Println("failed:", pgErr.ConstraintName)
	}

	var bob int
	if err := pool.QueryRow(ctx, "SELECT balance FROM accounts WHERE id = 'bob'").Scan(&bob); err != nil {
		log.Fatal(err)
	}
	fmt.Println("bob:", bob)

	// Output:
	// failed: accounts_balance_check
	// bob: 0
}

func ExampleMarkIdempotent() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	// Setting a balance to a fixed value twice is the same as once, so
	// if the COMMIT's answer is lost, Run may simply run it again.
	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
		tx.MarkIdempotent(dbtx)
		_, err := dbtx.Exec(ctx, "UPDATE accounts SET balance = 50 WHERE id = 'bob'")
		return err
	})
	if errors.Is(err, tx.ErrCommitUnknown) {
		// Without MarkIdempotent, this is where a lost COMMIT would end
		// up: look before trying again.
		log.Fatal(err)
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("done")

	// Output:
	// done
}

func ExampleIsRetryable() {
	deadlock := &pgconn.PgError{Severity: "ERROR", Code: "40P01", Message: "deadlock detected"}
	fmt.Println(tx.IsRetryable(fmt.Errorf("error moving money: %w", deadlock)))

	uniqueViolation := &pgconn.PgError{Severity: "ERROR", Code: "23505", Message: "duplicate key value"}
	fmt.Println(tx.IsRetryable(uniqueViolation))

	// Output:
	// true
	// false
}

func ExampleMaxAttempts() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	// A function that always conflicts is retried until the attempts
	// are used up.
	var calls int
	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
		calls++
		return &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "could not serialize access"}
	}, tx.MaxAttempts(3), tx.Backoff(0, 0))
	fmt.Println(calls, err)

	// Output:
	// 3 tx: giving up after 3 attempts: ERROR: could not serialize access (SQLSTATE 40001)
}
