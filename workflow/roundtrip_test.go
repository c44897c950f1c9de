package workflow_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/roundtrip"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// TestRoundTrips counts what a run costs on the wire against the same work done bare: a
// transaction, an outside call that does nothing, a transaction. The run writes its row with its
// first step, the call's checkpoint with the next transaction, and its outcome with its last
// step's COMMIT, so it makes fewer round trips than the bare transactions begun with
// pgx.BeginFunc, and as many commits.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	counter := &roundtrip.Counter{}
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	require.NoError(t, err)
	cfg.ConnConfig.DialFunc, cfg.ConnConfig.Tracer = counter.Dial, counter
	// pgxpool pings a connection idle for a second before handing it out: a round trip that is
	// the pool's, not the run's.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	insert := func(ctx context.Context, tx pgx.Tx, step string) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (run, step) VALUES ($1, $2)`, "rt", step)
		return err
	}
	wf := workflow.Define("rt", func(ctx context.Context, in int) (int, error) {
		if _, err := steps.Tx(ctx, "first", func(ctx context.Context, tx pgx.Tx) (int, error) { return 1, insert(ctx, tx, "first") }, nil); err != nil {
			return 0, err
		}
		if _, err := steps.Call(ctx, "call", func(context.Context, string) (int, error) { return 2, nil }, nil); err != nil {
			return 0, err
		}
		return steps.Tx(ctx, "last", func(ctx context.Context, tx pgx.Tx) (int, error) { return 3, insert(ctx, tx, "last") }, nil)
	})
	// A run whose first step is a Call commits its start on its own first: the call's derived key
	// needs the run's creation committed.
	callFirst := workflow.Define("rt-call-first", func(ctx context.Context, in int) (int, error) {
		if _, err := steps.Call(ctx, "call", func(context.Context, string) (int, error) { return 2, nil }, nil); err != nil {
			return 0, err
		}
		return steps.Tx(ctx, "last", func(ctx context.Context, tx pgx.Tx) (int, error) { return 3, insert(ctx, tx, "last") }, nil)
	})
	e, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{wf, callFirst}, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	run := func(i int) func() error {
		return func() error {
			_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: fmt.Sprint(i)}, i, nil)
			return err
		}
	}
	bare := func() error {
		if err := pgx.BeginFunc(b.ctx, pool, func(tx pgx.Tx) error { return insert(b.ctx, tx, "first") }); err != nil {
			return err
		}
		return pgx.BeginFunc(b.ctx, pool, func(tx pgx.Tx) error { return insert(b.ctx, tx, "last") })
	}
	runCallFirst := func(i int) func() error {
		return func() error {
			_, err := callFirst.Run(b.ctx, e, idem.Key{Scope: "c", ID: fmt.Sprint(i)}, i, nil)
			return err
		}
	}
	// Warm every connection's statement cache, as in a long-lived pool.
	for i := range 20 {
		require.NoError(t, run(-1-i)())
		require.NoError(t, run(-1-i)()) // and its replay
		require.NoError(t, runCallFirst(-1-i)())
		require.NoError(t, bare())
	}
	measure := func(f func() error) (trips, statements int) {
		counter.Reset()
		require.NoError(t, f())
		return counter.Counts()
	}

	trips, statements := measure(bare)
	require.Equal(t, 6, trips, "BEGIN, INSERT, COMMIT, twice")
	require.Equal(t, 6, statements)

	trips, statements = measure(run(1))
	require.Equal(t, 5, trips, "BEGIN+start, INSERT, checkpoint+COMMIT; BEGIN+INSERT, checkpoints+outcome+COMMIT")
	require.Equal(t, 11, statements, "BEGIN, start, INSERT, checkpoint, COMMIT, BEGIN, INSERT, two checkpoints, outcome, COMMIT")

	trips, statements = measure(run(1))
	require.Equal(t, 2, trips, "a replay: BEGIN+start, which reads the stored outcome, then ROLLBACK (%d statements)", statements)
	require.Equal(t, 3, statements)

	trips, statements = measure(runCallFirst(1))
	require.Equal(t, 4, trips, "BEGIN+start, COMMIT; BEGIN+INSERT, checkpoints+outcome+COMMIT (%d statements)", statements)
	require.Equal(t, 9, statements, "BEGIN, start, COMMIT, BEGIN, INSERT, two checkpoints, outcome, COMMIT")
}
