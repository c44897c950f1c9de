package workflow_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// BenchmarkFanOut compares a fan-out of ten transactions done as a workflow of ten parallel Tx
// branches (steps.GoTx, at most eight at once, then steps.GetAll) with the same ten transactions
// bare, begun with pgx.BeginFunc: ten at once from as many goroutines (limited to eight, as the
// branches are), and one after another. Each op is one whole fan-out. scripts/bench fanout runs it
// in interleaved rounds and prints the ratios.
//
//	go test -run '^$' -bench FanOut -benchtime 2s ./workflow/
func BenchmarkFanOut(b *testing.B) {
	tb := setup(b)
	ctx := tb.ctx
	insert := func(ctx context.Context, tx pgx.Tx, i int) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (run, step) VALUES ('fan', $1)`, strconv.Itoa(i))
		return err
	}
	wf := workflow.Define("fan", func(ctx context.Context, _ int) (int, error) {
		fs := make([]*steps.Future[int], 10)
		for i := range fs {
			fs[i] = steps.GoTx(ctx, "b"+strconv.Itoa(i), func(ctx context.Context, tx pgx.Tx) (int, error) { return i, insert(ctx, tx, i) }, nil)
		}
		_, err := steps.GetAll(ctx, fs)
		return 0, err
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
				if _, err := wf.Run(ctx, e, idem.Key{Scope: "bench", ID: fmt.Sprintf("f%d", runs)}, runs, nil); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"BareConcurrent", func(b *testing.B) {
			sem := make(chan struct{}, workflow.DefaultMaxParallelSteps)
			for range b.N {
				var wg sync.WaitGroup
				errs := make(chan error, 10)
				for i := range 10 {
					wg.Add(1)
					sem <- struct{}{}
					go func() {
						defer wg.Done()
						defer func() { <-sem }()
						errs <- pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error { return insert(ctx, tx, i) })
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		}},
		{"BareSequential", func(b *testing.B) {
			for range b.N {
				for i := range 10 {
					if err := pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error { return insert(ctx, tx, i) }); err != nil {
						b.Fatal(err)
					}
				}
			}
		}},
	}
	shift, _ := strconv.Atoi(os.Getenv("BENCH_SHIFT"))
	shift %= len(variants)
	for _, v := range append(variants[shift:], variants[:shift]...) {
		b.Run(v.name, v.run)
	}
}
