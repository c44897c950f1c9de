package steps_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// startRiver starts a River client that works engine's jobs, with the settings the README
// recommends for workflows that wait; it returns a function that stops it.
func startRiver(ctx context.Context, pool *pgxpool.Pool, engine *workflow.Engine) func() {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	workers := river.NewWorkers()
	if err := engine.AddWorkers(workers); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:           workers,
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 100 * time.Millisecond,
		Logger:            quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	engine.SetClient(client)
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return func() { _ = client.Stop(ctx) }
}

// riverPool returns a pool on a fresh database with idem's and River's tables and an orders
// table.
func riverPool(ctx context.Context) *pgxpool.Pool {
	pool := idemtest.NewExamplePool(&idemtest.Opts{River: true})
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	return pool
}

// Sleep gives the run's goroutine and lease back; a River job wakes it at its time.
func ExampleSleep() {
	ctx := context.Background()
	pool := riverPool(ctx)
	defer pool.Close()

	nap := workflow.Define("nap", func(ctx context.Context, d time.Duration) (string, error) {
		if err := steps.Sleep(ctx, "nap", d); err != nil {
			return "", err
		}
		return "awake", nil
	})
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{nap}})
	if err != nil {
		log.Fatal(err)
	}
	defer startRiver(ctx, pool, engine)()

	key := idem.Key{Scope: "shop", ID: "nap-1"}
	_, err = nap.Run(ctx, engine, key, 500*time.Millisecond, nil)
	fmt.Println("sleeping:", errors.Is(err, idem.ErrInFlight))
	out, err := nap.Run(ctx, engine, key, 500*time.Millisecond, &workflow.RunOpts{Wait: 10 * time.Second})
	fmt.Println(out, err)
	// Output:
	// sleeping: true
	// awake <nil>
}

// Await returns a signal sent before the run got there at once, and branches on a timeout.
func ExampleAwait() {
	ctx := context.Background()
	pool := riverPool(ctx)
	defer pool.Close()

	type Approval struct {
		By string `json:"by"`
	}
	ship := workflow.Define("ship", func(ctx context.Context, order string) (string, error) {
		if _, err := steps.Tx(ctx, "record", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			var id int64
			return id, tx.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, order).Scan(&id)
		}, nil); err != nil {
			return "", err
		}
		a, err := steps.Await[Approval](ctx, "approval", "approved", 300*time.Millisecond)
		switch {
		case errors.Is(err, workflow.ErrAwaitTimeout):
			return order + " not approved in time", nil
		case err != nil:
			return "", err
		}
		return order + " approved by " + a.By, nil
	})
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{ship}})
	if err != nil {
		log.Fatal(err)
	}
	defer startRiver(ctx, pool, engine)()

	for _, order := range []string{"book", "lamp"} {
		key := idem.Key{Scope: "shop", ID: order}
		_, err := ship.Run(ctx, engine, key, order, nil)
		fmt.Println(order, "awaiting:", errors.Is(err, idem.ErrInFlight))
		if order == "book" {
			err := pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error {
				_, err := engine.SignalTx(ctx, t, key, "approved", Approval{By: "ada"}, nil)
				return err
			})
			if err != nil {
				log.Fatal(err)
			}
		}
		out, err := ship.Run(ctx, engine, key, order, &workflow.RunOpts{Wait: 10 * time.Second})
		fmt.Println(out, err)
	}
	// Output:
	// book awaiting: true
	// book approved by ada <nil>
	// lamp awaiting: true
	// lamp not approved in time <nil>
}
