package workflow_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// BenchmarkRunWAL reports the write-ahead log a run of Tx, Call, Tx writes (wal-B/op), against
// the same two transactions bare: what a run's bookkeeping costs the log, for changes that add
// columns or indexes to a run's rows. Run it on a Postgres of its own (no TEST_DATABASE_URL), so
// that nothing else writes to the log meanwhile.
//
//	go test -run '^$' -bench RunWAL -count 3 ./workflow/
func BenchmarkRunWAL(b *testing.B) {
	bundle := setup(b)
	ctx := context.Background()
	insert := func(ctx context.Context, tx pgx.Tx, step string) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (run, step) VALUES ('wal', $1)`, step)
		return err
	}
	wf := workflow.Define("wal", func(ctx context.Context, in int) (int, error) {
		if _, err := steps.Tx(ctx, "first", func(ctx context.Context, tx pgx.Tx) (int, error) { return 1, insert(ctx, tx, "first") }, nil); err != nil {
			return 0, err
		}
		if _, err := steps.Call(ctx, "call", func(context.Context, string) (int, error) { return 2, nil }, nil); err != nil {
			return 0, err
		}
		return steps.Tx(ctx, "last", func(ctx context.Context, tx pgx.Tx) (int, error) { return 3, insert(ctx, tx, "last") }, nil)
	})
	e := bundle.engine(b, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quietLogger()})
	wal := func() int64 {
		var lsn int64
		require.NoError(b, bundle.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&lsn))
		return lsn
	}
	measure := func(b *testing.B, op func(i int) error) {
		require.NoError(b, op(-1)) // warm the statement caches
		before := wal()
		b.ResetTimer()
		for i := range b.N {
			require.NoError(b, op(i))
		}
		b.StopTimer()
		b.ReportMetric(float64(wal()-before)/float64(b.N), "wal-B/op")
	}
	// The testing package calls a sub-benchmark's function more than once, with a growing b.N,
	// in the same database: each call runs keys of its own, since a key run before would only
	// replay its stored outcome, which writes nothing, and the figure would fall with every call.
	calls := 0
	b.Run("run", func(b *testing.B) {
		calls++
		call := calls
		measure(b, func(i int) error {
			_, err := wf.Run(ctx, e, idem.Key{Scope: "s", ID: fmt.Sprintf("%d-%d", call, i)}, i, nil)
			return err
		})
	})
	b.Run("bare", func(b *testing.B) {
		measure(b, func(int) error {
			if err := pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error { return insert(ctx, tx, "first") }); err != nil {
				return err
			}
			return pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error { return insert(ctx, tx, "last") })
		})
	})
}
