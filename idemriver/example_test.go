package idemriver_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemriver"
	"github.com/idemkit/idem/idemtest"
)

// An application that uses idem.Do (or idemhttp) without the workflow engine registers the reap
// job in its River client, so that expired keys do not pile up.
func ExampleAddReapWorker() {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(&idemtest.Opts{River: true}) // or pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	defer pool.Close()

	cfg := &idemriver.ReapConfig{Interval: time.Minute}
	workers := river.NewWorkers()
	if err := idemriver.AddReapWorker(workers, pool, cfg); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:      workers,
		PeriodicJobs: []*river.PeriodicJob{idemriver.ReapPeriodicJob(cfg)},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	_, err = idem.Run(ctx, pool, idem.Key{Scope: "shop", ID: "order-1"}, func(context.Context, pgx.Tx) (string, error) {
		return "placed", nil
	})
	fmt.Println(err)
	// Output: <nil>
}

// Every process migrates idem's tables and River's at its start, through one call that holds an
// advisory lock while it does: processes that start at once do not race on River's migrations.
func ExampleMigrate() {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(nil) // or pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	defer pool.Close()

	if err := idemriver.Migrate(ctx, pool, &idemriver.MigrateConfig{Logger: slog.New(slog.DiscardHandler)}); err != nil {
		log.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename IN ('river_job', 'idem_keys')`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("tables:", n)
	// Output: tables: 2
}
