package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// exampleRiver starts a River client for engine with the settings the README recommends for
// workflows that wait, and returns a function that stops it.
func exampleRiver(ctx context.Context, pool *pgxpool.Pool, engine *workflow.Engine) func() {
	workers := river.NewWorkers()
	if err := engine.AddWorkers(workers); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:           workers,
		PeriodicJobs:      engine.PeriodicJobs(),
		FetchCooldown:     10 * time.Millisecond,  // notifies and fetches every 10ms, not 100ms
		FetchPollInterval: 100 * time.Millisecond, // due wake-ups are found within 100ms, not 1s
		Logger:            quietLogger(),
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

// A run awaits a signal that a webhook handler sends inside its own transaction; the same
// webhook delivered twice is one signal.
func ExampleEngine_SignalTx() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	confirm := workflow.Define("confirm", func(ctx context.Context, order string) (string, error) {
		charge, err := steps.Await[string](ctx, "confirmation", "charge.confirmed", time.Hour)
		if errors.Is(err, workflow.ErrAwaitTimeout) {
			return "released " + order, nil
		}
		if err != nil {
			return "", err
		}
		return order + " paid by " + charge, nil
	})
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{confirm}, Logger: quietLogger()})
	if err != nil {
		log.Fatal(err)
	}
	defer exampleRiver(ctx, pool, engine)()

	key := idem.Key{Scope: "shop", ID: "order-7"}
	_, err = confirm.Run(ctx, engine, key, "order-7", nil)
	fmt.Println("awaiting:", errors.Is(err, idem.ErrInFlight))

	webhook := func(eventID, charge string) {
		err := pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error {
			// ... the handler's own writes go here, in t ...
			res, err := engine.SignalTx(ctx, t, key, "charge.confirmed", charge, &workflow.SignalOpts{DedupeID: eventID})
			if err == nil {
				fmt.Println("duplicate:", res.Duplicate)
			}
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	webhook("evt_1", "ch_42")
	webhook("evt_1", "ch_42") // delivered again by the provider

	out, err := confirm.Run(ctx, engine, key, "order-7", &workflow.RunOpts{Wait: 10 * time.Second})
	fmt.Println(out, err)
	// Output:
	// awaiting: true
	// duplicate: false
	// duplicate: true
	// order-7 paid by ch_42 <nil>
}

// A run publishes its progress; a client reads it without running anything.
func ExampleEngine_EventGet() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	export := workflow.Define("export", func(ctx context.Context, rows int) (int, error) {
		if err := steps.SetEvent(ctx, "status", "exporting"); err != nil {
			return 0, err
		}
		if err := steps.Sleep(ctx, "throttle", 200*time.Millisecond); err != nil {
			return 0, err
		}
		return rows, steps.SetEvent(ctx, "status", "done")
	})
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{export}, Logger: quietLogger()})
	if err != nil {
		log.Fatal(err)
	}
	defer exampleRiver(ctx, pool, engine)()

	key := idem.Key{Scope: "shop", ID: "export-1"}
	_, err = export.Run(ctx, engine, key, 500, nil)
	fmt.Println("sleeping:", errors.Is(err, idem.ErrInFlight))
	status, err := workflow.GetEvent[string](ctx, engine, key, "status", time.Second)
	fmt.Println(status, err)

	n, err := export.Run(ctx, engine, key, 500, &workflow.RunOpts{Wait: 10 * time.Second})
	fmt.Println(n, err)
	status, err = workflow.GetEvent[string](ctx, engine, key, "status", 0)
	fmt.Println(status, err)
	// Output:
	// sleeping: true
	// exporting <nil>
	// 500 <nil>
	// done <nil>
}

// A deadline stored with the run: the run sleeps past it, is woken at it, and is timed out for
// good.
func ExampleRunOpts_timeout() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	remind := workflow.Define("remind", func(ctx context.Context, to string) (string, error) {
		if err := steps.Sleep(ctx, "three-days", 72*time.Hour); err != nil {
			return "", err
		}
		return "reminded " + to, nil
	})
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{remind}, Logger: quietLogger()})
	if err != nil {
		log.Fatal(err)
	}
	defer exampleRiver(ctx, pool, engine)()

	key := idem.Key{Scope: "shop", ID: "remind-1"}
	_, err = remind.Run(ctx, engine, key, "ada", &workflow.RunOpts{Timeout: time.Second})
	fmt.Println("sleeping:", errors.Is(err, idem.ErrInFlight))
	for errors.Is(err, idem.ErrInFlight) {
		_, err = remind.Run(ctx, engine, key, "ada", &workflow.RunOpts{Wait: 10 * time.Second})
	}
	fmt.Println(errors.Is(err, workflow.ErrDeadlineExceeded))
	// Output:
	// sleeping: true
	// true
}
