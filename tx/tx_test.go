package tx_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/tx"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

// The Beginners that Run documents.
var (
	_ tx.Beginner = (*pgxpool.Pool)(nil)
	_ tx.Beginner = (*pgxpool.Conn)(nil)
	_ tx.Beginner = (*pgx.Conn)(nil)
	_ tx.Beginner = pgx.Tx(nil)
)

// fastRetries keeps the waits between retries short in tests.
var fastRetries = tx.Backoff(time.Millisecond, 5*time.Millisecond)

type testBundle struct {
	pool *pgxpool.Pool
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtemp.NewPool(t)
	_, err := pool.Exec(context.Background(), "CREATE TABLE items (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)")
	require.NoError(t, err)
	return &testBundle{pool: pool}
}

func (b *testBundle) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM items").Scan(&n))
	return n
}

func insertItem(ctx context.Context, dbtx pgx.Tx, id int) error {
	_, err := dbtx.Exec(ctx, "INSERT INTO items (id) VALUES ($1)", id)
	return err
}

// retryableError asks Run to retry through the Retryable method.
type retryableError struct{}

func (retryableError) Error() string   { return "try again" }
func (retryableError) Retryable() bool { return true }

func TestRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Commits", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			return insertItem(ctx, dbtx, 1)
		})
		require.NoError(t, err)
		require.Equal(t, 1, bundle.count(t))
	})

	t.Run("WorksOnConn", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn, err := bundle.pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()

		err = tx.Run(ctx, conn.Conn(), func(ctx context.Context, dbtx pgx.Tx) error {
			return insertItem(ctx, dbtx, 1)
		}, tx.Isolation(pgx.RepeatableRead))
		require.NoError(t, err)
		require.Equal(t, 1, bundle.count(t))
	})

	t.Run("FnErrorRollsBackAndIsReturned", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		errBoom := errors.New("boom")

		var calls int
		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			if err := insertItem(ctx, dbtx, 1); err != nil {
				return err
			}
			return &wrapError{err: errBoom}
		})
		require.ErrorIs(t, err, errBoom)
		var wrapErr *wrapError
		require.ErrorAs(t, err, &wrapErr)
		require.Equal(t, 1, calls)
		require.Equal(t, 0, bundle.count(t))
	})

	t.Run("StatementErrorIsReturned", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			if err := insertItem(ctx, dbtx, 1); err != nil {
				return err
			}
			return insertItem(ctx, dbtx, 1)
		})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23505", pgErr.Code) // unique_violation: not retried
		require.Equal(t, 0, bundle.count(t))
	})

	t.Run("PanicRollsBack", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		require.PanicsWithValue(t, "boom", func() {
			_ = tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
				require.NoError(t, insertItem(ctx, dbtx, 1))
				panic("boom")
			})
		})
		require.Equal(t, 0, bundle.count(t))
		// The connection went back to the pool.
		require.Zero(t, bundle.pool.Stat().AcquiredConns())
	})

	t.Run("SwallowedStatementErrorFailsCommit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			_, _ = dbtx.Exec(ctx, "SELECT 1/0") // error ignored: the transaction is aborted
			return nil
		})
		require.ErrorIs(t, err, pgx.ErrTxCommitRollback)
		require.NotErrorIs(t, err, tx.ErrCommitUnknown)
	})

	t.Run("ErrorAtCommitIsKnown", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		_, err := bundle.pool.Exec(ctx, `CREATE TABLE codes (code text,
			CONSTRAINT codes_unique UNIQUE (code) DEFERRABLE INITIALLY DEFERRED)`)
		require.NoError(t, err)

		// A deferred constraint fails at COMMIT: the server answers, so the
		// outcome is a known rollback.
		var calls int
		err = tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			_, err := dbtx.Exec(ctx, "INSERT INTO codes VALUES ('a'), ('a')")
			return err
		})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23505", pgErr.Code)
		require.NotErrorIs(t, err, tx.ErrCommitUnknown)
		require.Equal(t, 1, calls)
	})

	t.Run("RetriesRetryableError", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		var calls int
		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			if err := insertItem(ctx, dbtx, 1); err != nil {
				return err
			}
			if calls < 3 {
				return retryableError{}
			}
			return nil
		}, fastRetries)
		require.NoError(t, err)
		require.Equal(t, 3, calls)
		// The failed attempts' inserts were rolled back, or the third
		// would have hit the primary key.
		require.Equal(t, 1, bundle.count(t))
	})

	t.Run("MaxAttempts", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		var calls int
		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			return &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "could not serialize access"}
		}, tx.MaxAttempts(3), fastRetries)
		require.Equal(t, 3, calls)
		require.ErrorContains(t, err, "giving up after 3 attempts: ")
		require.True(t, tx.IsRetryable(err))
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
	})

	t.Run("DefaultMaxAttemptsIsTen", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		var calls int
		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			return retryableError{}
		}, fastRetries)
		require.ErrorIs(t, err, retryableError{})
		require.Equal(t, 10, calls)
	})

	t.Run("InvalidOptions", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		for _, tt := range []struct {
			opt  tx.Option
			want string
		}{
			{tx.MaxAttempts(0), "tx: MaxAttempts must be at least 1 (got 0)"},
			{tx.Backoff(-time.Second, time.Second), "tx: Backoff min cannot be negative (got -1s)"},
			{tx.Backoff(time.Second, time.Millisecond), "tx: Backoff max cannot be less than min (got 1ms and 1s)"},
		} {
			err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
				t.Fatal("fn must not run")
				return nil
			}, tt.opt)
			require.EqualError(t, err, tt.want)
		}
	})

	t.Run("CancelStopsRetrying", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()

		var calls int
		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			if calls == 2 {
				cancel()
			}
			return retryableError{}
		}, fastRetries)
		require.Equal(t, 2, calls)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, retryableError{})
		require.ErrorContains(t, err, "stopped retrying after 2 attempts")
	})

	t.Run("CancelInterruptsBackoff", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()

		attempted := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
				close(attempted) // a second attempt would panic here
				return retryableError{}
			}, tx.Backoff(time.Hour, time.Hour))
		}()

		<-attempted
		cancel()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.Canceled)
			require.ErrorIs(t, err, retryableError{})
		case <-time.After(10 * time.Second):
			t.Fatal("Run kept waiting after its context was cancelled")
		}
	})

	t.Run("DoneContextBeginsNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		ctx, cancel := context.WithCancel(ctx)
		cancel()

		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			t.Fatal("fn must not run")
			return nil
		})
		require.ErrorIs(t, err, context.Canceled)
	})

	t.Run("Isolation", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		for _, level := range []pgx.TxIsoLevel{pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted} {
			var got string
			err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
				return dbtx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got)
			}, tx.Isolation(level))
			require.NoError(t, err)
			require.Equal(t, string(level), got)
		}
	})

	t.Run("ReadOnly", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		var calls int
		var readOnly string
		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			if err := dbtx.QueryRow(ctx, "SHOW transaction_read_only").Scan(&readOnly); err != nil {
				return err
			}
			return insertItem(ctx, dbtx, 1)
		}, tx.ReadOnly())
		require.Equal(t, "on", readOnly)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "25006", pgErr.Code) // read_only_sql_transaction
		require.Equal(t, 1, calls)
		require.Equal(t, 0, bundle.count(t))
	})

	t.Run("MarkIdempotentOutsideRunIsNoOp", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		dbtx, err := bundle.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = dbtx.Rollback(ctx) }()
		require.False(t, tx.MarkIdempotent(dbtx), "a transaction Run did not begin has nobody to rerun it")
		require.False(t, tx.MarkIdempotent(nil))
		require.NoError(t, tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			require.True(t, tx.MarkIdempotent(dbtx))
			sp, err := dbtx.Begin(ctx)
			require.NoError(t, err)
			require.True(t, tx.MarkIdempotent(sp), "a savepoint of Run's transaction passes the mark on")
			return sp.Commit(ctx)
		}))
	})
}

func TestRunNested(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReleasesSavepoint", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			return tx.Run(ctx, dbtx, func(ctx context.Context, sp pgx.Tx) error {
				return insertItem(ctx, sp, 1)
			})
		})
		require.NoError(t, err)
		require.Equal(t, 1, bundle.count(t))
	})

	t.Run("ErrorRollsBackToSavepointOnly", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		errBoom := errors.New("boom")

		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			err := tx.Run(ctx, dbtx, func(ctx context.Context, sp pgx.Tx) error {
				if err := insertItem(ctx, sp, 1); err != nil {
					return err
				}
				return errBoom
			})
			require.ErrorIs(t, err, errBoom)
			return insertItem(ctx, dbtx, 2) // the enclosing transaction goes on
		})
		require.NoError(t, err)

		var ids []int
		rows, err := bundle.pool.Query(ctx, "SELECT id FROM items")
		require.NoError(t, err)
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
		require.Equal(t, []int{2}, ids)
	})

	t.Run("LeavesRetryingToEnclosingRun", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		var outer, inner int
		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			outer++
			return tx.Run(ctx, dbtx, func(ctx context.Context, sp pgx.Tx) error {
				inner++
				if outer == 1 {
					return retryableError{}
				}
				return insertItem(ctx, sp, 1)
			})
		}, fastRetries)
		require.NoError(t, err)
		require.Equal(t, 2, outer)
		require.Equal(t, 2, inner)
		require.Equal(t, 1, bundle.count(t))
	})

	t.Run("RejectsTxOptions", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		err := tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			err := tx.Run(ctx, dbtx, func(ctx context.Context, sp pgx.Tx) error {
				t.Fatal("fn must not run")
				return nil
			}, tx.Isolation(pgx.Serializable))
			require.EqualError(t, err, "tx: isolation cannot be set on a nested transaction")

			err = tx.Run(ctx, dbtx, func(ctx context.Context, sp pgx.Tx) error {
				t.Fatal("fn must not run")
				return nil
			}, tx.ReadOnly())
			require.EqualError(t, err, "tx: read-only cannot be set on a nested transaction")
			return nil
		})
		require.NoError(t, err)
	})
}

type wrapError struct{ err error }

func (e *wrapError) Error() string { return "wrapped: " + e.err.Error() }
func (e *wrapError) Unwrap() error { return e.err }

// attempts counts the attempts of one Run for tests where several run at
// once.
type attempts struct{ n atomic.Int32 }

func (a *attempts) next() int { return int(a.n.Add(1)) }
func (a *attempts) load() int { return int(a.n.Load()) }
