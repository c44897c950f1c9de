package workflow_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// BenchmarkRunPayloads runs a three-step workflow (a transaction, an outside call that does
// nothing, a transaction) whose steps return outputs of a given size, on two engines in two
// schemas, one op on each in turn: in schema "parted" the partition of idem_run_payloads for the
// run's start day exists (outputs over 1 KiB go there), in schema "inline" it does not (every
// output stays in idem_steps, as before large payloads moved). Alternating op by op keeps the
// ratio of the two honest on a machine whose load drifts. It reports each one's time per run,
// and their ratio, by the median run (the machines these run on are shared: a mean is at the
// mercy of a few runs that waited for a CPU). On a schema from before idem_run_payloads, both
// are inline.
//
//	go test -run '^$' -bench RunPayloads -benchtime 300x -count 3 ./workflow/
func BenchmarkRunPayloads(b *testing.B) {
	tb := setup(b)
	ctx := tb.ctx
	insert := func(ctx context.Context, tx pgx.Tx, step string) error {
		_, err := tx.Exec(ctx, `INSERT INTO public.effects (run, step) VALUES ('bench', $1)`, step)
		return err
	}
	sizes := []struct {
		name string
		n    int
	}{{"small", 16}, {"4KiB", 4 << 10}, {"64KiB", 64 << 10}}
	wfs := map[string]*workflow.Workflow[int, int]{}
	var defs []workflow.Definition
	for _, s := range sizes {
		out := letters(s.n - 2) // JSON of s.n bytes
		wf := workflow.Define("bench-"+s.name, func(ctx context.Context, in int) (int, error) {
			if _, err := steps.Tx(ctx, "first", func(ctx context.Context, tx pgx.Tx) (string, error) { return out, insert(ctx, tx, "first") }, nil); err != nil {
				return 0, err
			}
			if _, err := steps.Call(ctx, "call", func(ctx context.Context, key string) (string, error) { return out, nil }, nil); err != nil {
				return 0, err
			}
			if _, err := steps.Tx(ctx, "last", func(ctx context.Context, tx pgx.Tx) (string, error) { return out, insert(ctx, tx, "last") }, nil); err != nil {
				return 0, err
			}
			return in, nil
		})
		wfs[s.name] = wf
		defs = append(defs, wf)
	}
	engines := map[string]*workflow.Engine{}
	for _, schema := range []string{"parted", "inline"} {
		if err := idem.Migrate(ctx, tb.pool, idem.Schema(schema)); err != nil {
			b.Fatal(err)
		}
		engines[schema] = tb.engine(b, &workflow.Config{Workflows: defs, Logger: quietLogger(), Schema: schema})
	}
	var today *time.Time
	if err := tb.pool.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date WHERE to_regclass('inline.idem_run_payloads') IS NOT NULL`).Scan(&today); err == nil {
		if _, err := tb.pool.Exec(ctx, `DROP TABLE inline.idem_run_payloads_p`+today.Format("20060102")); err != nil {
			b.Fatal(err)
		}
	}
	runs := 0
	run := func(b *testing.B, wf *workflow.Workflow[int, int], schema string) time.Duration {
		runs++
		start := time.Now()
		if _, err := wf.Run(ctx, engines[schema], idem.Key{Scope: "bench", ID: fmt.Sprintf("k%d", runs)}, runs, nil); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for _, s := range sizes {
		b.Run(s.name, func(b *testing.B) {
			wf := wfs[s.name]
			for range 3 { // every statement prepared on every connection used
				run(b, wf, "parted")
				run(b, wf, "inline")
			}
			var parted, inline []time.Duration
			b.ResetTimer()
			for i := range b.N {
				if i%2 == 0 {
					parted = append(parted, run(b, wf, "parted"))
					inline = append(inline, run(b, wf, "inline"))
				} else {
					inline = append(inline, run(b, wf, "inline"))
					parted = append(parted, run(b, wf, "parted"))
				}
			}
			p, q := median(parted), median(inline)
			b.ReportMetric(float64(p.Nanoseconds())/1e3, "parted-µs/run")
			b.ReportMetric(float64(q.Nanoseconds())/1e3, "inline-µs/run")
			b.ReportMetric(float64(p)/float64(q), "parted/inline")
		})
	}
}

// median is the middle of ds (which it sorts).
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// letters is n pseudo-random letters, which compress about as well as real JSON does.
func letters(n int) string {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	return string(b)
}
