package steps_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

func TestMain(m *testing.M) {
	code := pgtemp.Main(m)
	os.Exit(code)
}

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

func setup(t testing.TB) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	require.NoError(t, idem.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, note text)`)
	require.NoError(t, err)
	return &testBundle{ctx: ctx, pool: pool}
}

func (b *testBundle) engine(t testing.TB, wfs ...workflow.Definition) *workflow.Engine {
	t.Helper()
	e, err := workflow.NewEngine(b.pool, &workflow.Config{Workflows: wfs, Lease: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return e
}

func (b *testBundle) count(t testing.TB, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, sql).Scan(&n))
	return n
}

// waitLeaseExpired polls until the run's lease has run out by the database's clock.
func (b *testBundle) waitLeaseExpired(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.count(t, `SELECT count(*) FROM idem_runs WHERE lease_expires_at > now()`) > 0 {
		require.True(t, time.Now().Before(deadline), "lease did not expire")
		time.Sleep(50 * time.Millisecond)
	}
}

var key = idem.Key{Scope: "s", ID: "k1"}

func TestTx(t *testing.T) {
	t.Parallel()

	t.Run("SerializationFailureRerunsTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var runs atomic.Int32
		wf := workflow.Define("ser", func(ctx context.Context, in int) (int, error) {
			return steps.Tx(ctx, "write", func(ctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO effects (note) VALUES ('w')`); err != nil {
					return 0, err
				}
				if runs.Add(1) == 1 {
					return 0, &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
				}
				return 7, nil
			}, &steps.Opts{MaxAttempts: 1})
		})
		out, err := wf.Run(b.ctx, b.engine(t, wf), key, 1, nil)
		require.NoError(t, err)
		require.Equal(t, 7, out)
		require.EqualValues(t, 2, runs.Load())
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	})

	t.Run("ErrorRollsBackTheAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var runs atomic.Int32
		wf := workflow.Define("retry", func(ctx context.Context, in int) (int, error) {
			return steps.Tx(ctx, "write", func(ctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO effects (note) VALUES ('w')`); err != nil {
					return 0, err
				}
				if runs.Add(1) < 3 {
					return 0, errors.New("not yet")
				}
				return 1, nil
			}, &steps.Opts{MaxAttempts: 3, MinBackoff: time.Millisecond})
		})
		_, err := wf.Run(b.ctx, b.engine(t, wf), key, 1, nil)
		require.NoError(t, err)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`), "failed attempts must leave nothing")
	})

	t.Run("ChangedOutputTypeStopsTheRunWithoutFailingIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(b.ctx)
		v1 := workflow.Define("typed", func(ctx context.Context, in int) (int, error) {
			if _, err := steps.Tx(ctx, "a", func(ctx context.Context, tx pgx.Tx) (string, error) { return "text", nil }, nil); err != nil {
				return 0, err
			}
			// The process dies in the next step, once "a" has committed.
			return steps.Call(ctx, "b", func(ctx context.Context, _ string) (int, error) {
				cancel()
				return 0, ctx.Err()
			}, nil)
		})
		_, err := v1.Run(ctx, b.engine(t, v1), key, 1, nil)
		require.ErrorIs(t, err, context.Canceled)
		b.waitLeaseExpired(t)

		v2 := workflow.Define("typed", func(ctx context.Context, in int) (int, error) {
			return steps.Tx(ctx, "a", func(ctx context.Context, tx pgx.Tx) (int, error) { return 1, nil }, nil)
		})
		_, err = v2.Run(b.ctx, b.engine(t, v2), key, 1, nil)
		require.ErrorContains(t, err, "cannot be decoded into int")
		require.NotErrorIs(t, err, workflow.ErrFailed)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'running'`))
	})
}

func TestEnqueueNeedsAClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.Define("enq", func(ctx context.Context, in int) (int, error) {
		return 0, steps.Enqueue(ctx, "notify", noArgs{}, nil, nil)
	})
	e := b.engine(t, wf)
	_, err := wf.Run(b.ctx, e, key, 1, nil)
	require.ErrorContains(t, err, "Engine.SetClient")
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs WHERE state <> 'running'`), "a setup mistake must not fail the run for good")
	// The run never got past its first step, so nothing of it is stored: the caller's retry,
	// after the fix, runs it afresh.
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs`))

	// A run that exists already (started with StartTx, resumed by River) stays running.
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO idem_keys (scope, id, workflow, expires_at) VALUES ('s', 'k2', 'enq', 'infinity');
INSERT INTO idem_runs (scope, id, workflow, state, input, attempts, lease_expires_at) VALUES ('s', 'k2', 'enq', 'running', '1', 0, now() - interval '1 second')`)
	require.NoError(t, err)
	_, err = wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "k2"}, 1, nil)
	require.ErrorContains(t, err, "Engine.SetClient")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'running'`), "a setup mistake must not fail the run for good")
}

type noArgs struct{}

func (noArgs) Kind() string { return "no_args" }

func TestPermanent(t *testing.T) {
	t.Parallel()
	require.NoError(t, steps.Permanent(nil))
	base := errors.New("declined")
	err := steps.Permanent(base)
	require.ErrorIs(t, err, base)
	require.True(t, steps.IsPermanent(err))
	require.False(t, steps.IsPermanent(base))
	require.Equal(t, "declined", err.Error())
}

// TestEnqueueTakesStepOptions: Enqueue retries as its step options say, like the other kinds.
func TestEnqueueTakesStepOptions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{}) // inserts only
	require.NoError(t, err)
	wf := workflow.Define("enq-opts", func(ctx context.Context, in int) (int, error) {
		// River refuses the queue's name on every attempt.
		return 0, steps.Enqueue(ctx, "notify", noArgs{}, &river.InsertOpts{Queue: "no such queue!"},
			&steps.Opts{MaxAttempts: 2, MinBackoff: time.Millisecond})
	})
	e := b.engine(t, wf)
	e.SetClient(client)
	_, err = wf.Run(b.ctx, e, key, 1, nil)
	// The step's failure ended the run, which stores it as a message.
	require.ErrorIs(t, err, workflow.ErrFailed)
	require.ErrorContains(t, err, "failed after 2 attempts", "MaxAttempts applies to Enqueue")
	require.ErrorContains(t, err, "queue name is invalid")
}
