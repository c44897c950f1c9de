package tx_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/tx"
)

// Tests in this file make Postgres abort a transaction for real, with two
// transactions on two goroutines that meet at a barrier on their first
// attempt.

func TestRunConflicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RetriesSerializationFailure", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		_, err := bundle.pool.Exec(ctx, `
			CREATE TABLE doctors (name text PRIMARY KEY, on_call bool NOT NULL);
			INSERT INTO doctors VALUES ('alice', true), ('bob', true)`)
		require.NoError(t, err)

		// Each doctor goes off call if someone else is still on call: a
		// write skew. Both read before either writes, so without
		// SERIALIZABLE both would leave and nobody would be on call.
		var bothRead sync.WaitGroup
		bothRead.Add(2)
		goOffCall := func(name string, a *attempts) error {
			return tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) error {
				attempt := a.next()
				var onCall int
				if err := dbtx.QueryRow(ctx, "SELECT count(*) FROM doctors WHERE on_call").Scan(&onCall); err != nil {
					return err
				}
				if attempt == 1 {
					bothRead.Done()
					bothRead.Wait()
				}
				if onCall < 2 {
					return nil
				}
				_, err := dbtx.Exec(ctx, "UPDATE doctors SET on_call = false WHERE name = $1", name)
				return err
			}, tx.Isolation(pgx.Serializable), fastRetries)
		}

		var alice, bob attempts
		errs := make(chan error, 2)
		go func() { errs <- goOffCall("alice", &alice) }()
		go func() { errs <- goOffCall("bob", &bob) }()
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)

		// At least one was aborted with 40001 and ran again, seeing the
		// other gone. (A retry can conflict again if it runs before the
		// other commits, so the exact count varies.)
		require.GreaterOrEqual(t, alice.load()+bob.load(), 3)
		var onCall int
		require.NoError(t, bundle.pool.QueryRow(ctx, "SELECT count(*) FROM doctors WHERE on_call").Scan(&onCall))
		require.Equal(t, 1, onCall)
	})

	t.Run("RetriesDeadlock", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		_, err := bundle.pool.Exec(ctx, "INSERT INTO items (id) VALUES (1), (2)")
		require.NoError(t, err)

		var (
			bothLocked sync.WaitGroup
			mu         sync.Mutex
			codes      []string // SQLSTATEs fn saw
		)
		bothLocked.Add(2)
		// touch updates two rows in the given order; run twice in
		// opposite orders, it deadlocks. The backend that runs the
		// deadlock check is the one aborted, so a short deadlock_timeout
		// on one side only picks the loser and keeps the test quick.
		touch := func(first, second int, deadlockTimeout string, a *attempts) error {
			return tx.Run(ctx, bundle.pool, func(ctx context.Context, dbtx pgx.Tx) (err error) {
				defer func() {
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) {
						mu.Lock()
						codes = append(codes, pgErr.Code)
						mu.Unlock()
					}
				}()
				attempt := a.next()
				if _, err := dbtx.Exec(ctx, "SELECT set_config('deadlock_timeout', $1, true)", deadlockTimeout); err != nil {
					return err
				}
				if _, err := dbtx.Exec(ctx, "UPDATE items SET n = n + 1 WHERE id = $1", first); err != nil {
					return err
				}
				if attempt == 1 {
					bothLocked.Done()
					bothLocked.Wait()
				}
				_, err = dbtx.Exec(ctx, "UPDATE items SET n = n + 1 WHERE id = $1", second)
				return err
			}, fastRetries)
		}

		var loser, winner attempts
		errs := make(chan error, 2)
		go func() { errs <- touch(1, 2, "10ms", &loser) }()
		go func() { errs <- touch(2, 1, "1min", &winner) }()
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)

		// The loser can deadlock again: its retry may lock row 1 before
		// the woken winner takes it. Each deadlock costs one attempt.
		require.NotEmpty(t, codes)
		for _, code := range codes {
			require.Equal(t, "40P01", code)
		}
		require.Equal(t, 1+len(codes), loser.load())
		require.Equal(t, 1, winner.load())
		// Both transactions committed in full, once each.
		rows, err := bundle.pool.Query(ctx, "SELECT n FROM items ORDER BY id")
		require.NoError(t, err)
		ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
		require.Equal(t, []int{2, 2}, ns)
	})
}
