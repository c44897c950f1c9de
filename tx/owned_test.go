package tx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/txctl"
	"github.com/idemkit/idem/tx"
)

// TestOwnedTransaction covers the transaction Run hands to fn when it holds the connection
// itself (a pool, a conn): BEGIN sent with the first statement, writes queued for COMMIT, and
// everything a pgx.Tx can do still doing what it does in a plain transaction.
func TestOwnedTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// queue queues an insert of id to be sent with COMMIT, as idem.Do queues its key.
	queue := func(t *testing.T, dbtx pgx.Tx, id int) {
		t.Helper()
		a, canDefer := txctl.From(dbtx)
		require.NotNil(t, a)
		if canDefer {
			a.Queue(txctl.Deferred{SQL: "INSERT INTO items (id) VALUES ($1)", Args: []any{id}})
			return
		}
		require.NoError(t, insertItem(ctx, dbtx, id))
	}
	ids := func(t *testing.T, b *testBundle) []int {
		t.Helper()
		rows, err := b.pool.Query(ctx, "SELECT id FROM items ORDER BY id")
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
		return out
	}

	t.Run("QueryWithBeginReturnsEveryRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			rows, err := dbtx.Query(ctx, "SELECT g FROM generate_series(1, $1::int) g", 500)
			if err != nil {
				return err
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			require.NoError(t, err)
			require.Len(t, got, 500)
			// The batch that carried BEGIN is over: the connection takes the next statement.
			return insertItem(ctx, dbtx, 1)
		}))
		require.Equal(t, []int{1}, ids(t, b))
	})

	t.Run("RowsLoopedWithoutCloseStillEndTheBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			rows, err := dbtx.Query(ctx, "SELECT g FROM generate_series(1, $1::int) g", 3)
			if err != nil {
				return err
			}
			n := 0
			for rows.Next() {
				n++
			}
			require.NoError(t, rows.Err())
			require.Equal(t, 3, n)
			return insertItem(ctx, dbtx, 2) // no "conn busy": Next's end closed the batch
		}))
		require.Equal(t, []int{2}, ids(t, b))
	})

	t.Run("AnErrorInTheFirstStatementRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		err := tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			var n int
			if err := dbtx.QueryRow(ctx, "SELECT 1/$1::int", 0).Scan(&n); err != nil {
				return err
			}
			return insertItem(ctx, dbtx, 1)
		})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "22012", pgErr.Code) // division_by_zero
		require.Empty(t, ids(t, b))
		// The connection went back to the pool clean.
		var status string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT 'idle'").Scan(&status))
	})

	t.Run("QueuedWritesGoWithCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			queue(t, dbtx, 2)
			queue(t, dbtx, 3)
			return insertItem(ctx, dbtx, 1)
		}))
		require.Equal(t, []int{1, 2, 3}, ids(t, b))
	})

	t.Run("QueuedWritesAloneSendBeginWithCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			queue(t, dbtx, 7)
			return nil
		}))
		require.Equal(t, []int{7}, ids(t, b))
	})

	t.Run("AFailedQueuedWriteRollsBackEverything", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(ctx, "INSERT INTO items (id) VALUES (0)")
		require.NoError(t, err)
		errMapped := errors.New("mapped")
		calls := 0
		err = tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			a, _ := txctl.From(dbtx)
			a.Queue(txctl.Deferred{SQL: "INSERT INTO items (id) VALUES ($1)", Args: []any{5}})
			a.Queue(txctl.Deferred{SQL: "INSERT INTO items (id) VALUES ($1)", Args: []any{5}, MapErr: func(err error) error {
				return fmt.Errorf("%w: %w", errMapped, err)
			}})
			return insertItem(ctx, dbtx, 1)
		})
		require.ErrorIs(t, err, errMapped, "the queued write's own error mapping applies")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23505", pgErr.Code)
		require.NotErrorIs(t, err, tx.ErrCommitUnknown, "an ERROR from the server is a known rollback")
		require.Equal(t, 1, calls)
		require.Equal(t, []int{0}, ids(t, b), "neither fn's write nor the queued ones committed")
	})

	t.Run("RawSavepointSendsQueuedWritesFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			queue(t, dbtx, 1) // before the savepoint: must survive the ROLLBACK TO
			if _, err := dbtx.Exec(ctx, "SAVEPOINT s"); err != nil {
				return err
			}
			_, canDefer := txctl.From(dbtx)
			require.False(t, canDefer, "after raw transaction control, writes are not queued")
			queue(t, dbtx, 2) // inside the savepoint: must go with it
			if _, err := dbtx.Exec(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
				return err
			}
			return insertItem(ctx, dbtx, 3)
		}))
		require.Equal(t, []int{1, 3}, ids(t, b))
	})

	t.Run("SavepointsWork", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			sp, err := dbtx.Begin(ctx)
			if err != nil {
				return err
			}
			_, canDefer := txctl.From(sp)
			require.False(t, canDefer, "a savepoint may roll back: its writes are not queued")
			require.NoError(t, insertItem(ctx, sp, 1))
			require.NoError(t, sp.Rollback(ctx))
			sp, err = dbtx.Begin(ctx)
			if err != nil {
				return err
			}
			require.NoError(t, insertItem(ctx, sp, 2))
			return sp.Commit(ctx)
		}))
		require.Equal(t, []int{2}, ids(t, b))
	})

	t.Run("ConnSendsBeginAndQueuedWrites", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			queue(t, dbtx, 1)
			conn := dbtx.Conn()
			require.Equal(t, byte('T'), conn.PgConn().TxStatus(), "the transaction has begun")
			var n int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n))
			require.Equal(t, 1, n, "the queued write went out before fn used the connection")
			return nil
		}))
		require.Equal(t, []int{1}, ids(t, b))
	})

	t.Run("BatchCopyAndArgumentlessStatementsWork", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			if _, err := dbtx.Exec(ctx, "SET LOCAL lock_timeout = '5s'; SET LOCAL statement_timeout = '5s'"); err != nil {
				return err
			}
			if _, err := dbtx.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id"}, pgx.CopyFromRows([][]any{{1}, {2}})); err != nil {
				return err
			}
			batch := &pgx.Batch{}
			batch.Queue("INSERT INTO items (id) VALUES ($1)", 3)
			return dbtx.SendBatch(ctx, batch).Close()
		}))
		require.Equal(t, []int{1, 2, 3}, ids(t, b))
	})

	t.Run("FnCannotEndTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var kept pgx.Tx
		err := tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
			kept = dbtx
			require.NoError(t, insertItem(ctx, dbtx, 1))
			require.Error(t, dbtx.Commit(ctx))
			require.Error(t, dbtx.Rollback(ctx))
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, []int{1}, ids(t, b))
		_, err = kept.Exec(ctx, "INSERT INTO items (id) VALUES ($1)", 2)
		require.ErrorIs(t, err, pgx.ErrTxClosed, "a transaction kept past fn must not reach a pooled connection")
	})

	t.Run("PanicRollsBackAndReleases", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.Panics(t, func() {
			_ = tx.Run(ctx, b.pool, func(ctx context.Context, dbtx pgx.Tx) error {
				require.NoError(t, insertItem(ctx, dbtx, 1))
				panic("boom")
			})
		})
		require.Empty(t, ids(t, b))
		require.Zero(t, b.pool.Stat().AcquiredConns(), "the connection was given back")
	})

	t.Run("SingleConnection", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		conn, err := b.pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		require.NoError(t, tx.Run(ctx, conn, func(ctx context.Context, dbtx pgx.Tx) error {
			queue(t, dbtx, 2)
			return insertItem(ctx, dbtx, 1)
		}))
		require.Equal(t, []int{1, 2}, ids(t, b))

		// Run refuses a connection that is in a transaction already.
		_, err = conn.Exec(ctx, "BEGIN")
		require.NoError(t, err)
		err = tx.Run(ctx, conn, func(ctx context.Context, dbtx pgx.Tx) error { return nil })
		require.ErrorContains(t, err, "already in a transaction")
		_, err = conn.Exec(ctx, "ROLLBACK")
		require.NoError(t, err)
	})
}
