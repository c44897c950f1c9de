package workflow_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// BenchmarkThreeSteps compares one unit of work (a transaction, an outside call that does
// nothing, a transaction) done three ways: as a workflow, as the bare transactions, and as
// three chained River jobs (each inserted by the one before it in its transaction, the usual
// way to get durable steps from a queue). Each op is one whole unit, end to end, on one client.
// scripts/bench workflow runs it in interleaved rounds and prints the ratios.
//
//	go test -run '^$' -bench ThreeSteps -benchtime 2s ./workflow/
func BenchmarkThreeSteps(b *testing.B) {
	tb := setup(b)
	ctx := tb.ctx
	insert := func(ctx context.Context, tx pgx.Tx, step string) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (run, step) VALUES ('bench', $1)`, step)
		return err
	}
	wf := workflow.Define("bench", func(ctx context.Context, in int) (int, error) {
		if _, err := steps.Tx(ctx, "first", func(ctx context.Context, tx pgx.Tx) (int, error) { return 1, insert(ctx, tx, "first") }, nil); err != nil {
			return 0, err
		}
		if _, err := steps.Call(ctx, "call", func(ctx context.Context, key string) (int, error) { return 2, nil }, nil); err != nil {
			return 0, err
		}
		return steps.Tx(ctx, "last", func(ctx context.Context, tx pgx.Tx) (int, error) { return 3, insert(ctx, tx, "last") }, nil)
	})
	e := tb.engine(b, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quietLogger()})
	var runs int

	variants := []struct {
		name string
		run  func(b *testing.B)
	}{
		{"Workflow", func(b *testing.B) {
			for range b.N {
				runs++
				if _, err := wf.Run(ctx, e, idem.Key{Scope: "bench", ID: fmt.Sprintf("k%d", runs)}, runs, nil); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"BareTransactions", func(b *testing.B) {
			for range b.N {
				if err := pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error { return insert(ctx, tx, "first") }); err != nil {
					b.Fatal(err)
				}
				func(context.Context, string) {}(ctx, "no-op call")
				if err := pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error { return insert(ctx, tx, "last") }); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"ChainedRiverJobs", func(b *testing.B) {
			client, done := chainedJobs(b, tb, insert)
			b.ResetTimer()
			for i := range b.N {
				if _, err := client.Insert(ctx, chainFirst{N: i}, nil); err != nil {
					b.Fatal(err)
				}
				if n := <-done; n != i {
					b.Fatalf("chain %d finished while waiting for %d", n, i)
				}
			}
			b.StopTimer()
			_ = client.Stop(context.Background())
		}},
	}
	// scripts/bench starts each round (a process) with another variant.
	shift, _ := strconv.Atoi(os.Getenv("BENCH_SHIFT"))
	shift %= len(variants)
	for _, v := range append(variants[shift:], variants[:shift]...) {
		b.Run(v.name, v.run)
	}
}

// chainedJobs starts a River client whose three workers chain one unit of work, and returns it
// with the channel that receives each finished unit.
func chainedJobs(b *testing.B, tb *testBundle, insert func(context.Context, pgx.Tx, string) error) (*river.Client[pgx.Tx], chan int) {
	done := make(chan int, 1)
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[chainFirst]) error {
		return pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error {
			if err := insert(ctx, tx, "first"); err != nil {
				return err
			}
			_, err := river.ClientFromContext[pgx.Tx](ctx).InsertTx(ctx, tx, chainCall(job.Args), nil)
			return err
		})
	}))
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[chainCall]) error {
		_, err := river.ClientFromContext[pgx.Tx](ctx).Insert(ctx, chainLast(job.Args), nil)
		return err
	}))
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[chainLast]) error {
		err := pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error { return insert(ctx, tx, "last") })
		done <- job.Args.N
		return err
	}))
	client, err := river.NewClient(riverpgxv5.New(tb.pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:           workers,
		FetchCooldown:     time.Millisecond,
		FetchPollInterval: 10 * time.Millisecond,
		Logger:            quietLogger(),
		TestOnly:          true,
	})
	require.NoError(b, err)
	require.NoError(b, client.Start(tb.ctx))
	return client, done
}

type chainFirst struct{ N int }

func (chainFirst) Kind() string { return "bench_first" }

type chainCall chainFirst

func (chainCall) Kind() string { return "bench_call" }

type chainLast chainFirst

func (chainLast) Kind() string { return "bench_last" }
