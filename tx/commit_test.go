package tx_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/txctl"
	"github.com/idemkit/idem/tx"
)

// Tests in this file break connections, and lose COMMITs, with a faultproxy.

type lostCommitBundle struct {
	direct  *pgxpool.Pool // straight to Postgres, to see what landed
	proxied *pgxpool.Pool // through the proxy
	proxy   *faultproxy.Proxy
}

func setupLostCommit(t *testing.T) *lostCommitBundle {
	t.Helper()
	ctx := context.Background()

	dbURL := pgtemp.NewDB(t)
	proxied, proxy := faultproxy.NewPool(t, dbURL)
	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)

	_, err = direct.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)")
	require.NoError(t, err)
	return &lostCommitBundle{direct: direct, proxied: proxied, proxy: proxy}
}

func (b *lostCommitBundle) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.direct.QueryRow(context.Background(), "SELECT count(*) FROM items").Scan(&n))
	return n
}

// upsertItem is idempotent: run twice, it leaves what running once does.
func upsertItem(ctx context.Context, dbtx pgx.Tx, id int) error {
	_, err := dbtx.Exec(ctx, "INSERT INTO items (id) VALUES ($1) ON CONFLICT (id) DO NOTHING", id)
	return err
}

func TestRunLostCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, tt := range []struct {
		name   string
		inject func(*faultproxy.Proxy)
		landed int // rows after the lost COMMIT
	}{
		{"ReplyLost", (*faultproxy.Proxy).LoseNextCommitReply, 1},
		{"CommitDropped", (*faultproxy.Proxy).DropNextCommit, 0},
	} {
		t.Run(tt.name+"IsUnknown", func(t *testing.T) {
			t.Parallel()
			bundle := setupLostCommit(t)

			var calls int
			tt.inject(bundle.proxy)
			err := tx.Run(ctx, bundle.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
				calls++
				return insertItem(ctx, dbtx, 1)
			}, fastRetries)

			require.ErrorIs(t, err, tx.ErrCommitUnknown)
			require.ErrorContains(t, err, "check before retrying")
			// The cause is there too: the connection went while COMMIT's
			// answer was awaited.
			require.True(t, tx.IsConnectionLost(err), "cause: %v", err)
			require.False(t, tx.IsRetryable(err))
			require.Equal(t, 1, calls)
			require.Equal(t, tt.landed, bundle.count(t))
			require.Equal(t, 1, bundle.proxy.Stats().Commits)
		})

		t.Run(tt.name+"WithMarkIdempotentRetries", func(t *testing.T) {
			t.Parallel()
			bundle := setupLostCommit(t)

			var calls int
			tt.inject(bundle.proxy)
			err := tx.Run(ctx, bundle.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
				calls++
				tx.MarkIdempotent(dbtx)
				return upsertItem(ctx, dbtx, 1)
			}, fastRetries)

			require.NoError(t, err)
			require.Equal(t, 2, calls)
			require.Equal(t, 1, bundle.count(t))
			require.Equal(t, 2, bundle.proxy.Stats().Commits)
		})
	}

	t.Run("MarkLastsOneAttempt", func(t *testing.T) {
		t.Parallel()
		bundle := setupLostCommit(t)

		// The first attempt marks itself and loses its COMMIT; the rerun
		// does not mark itself and loses its COMMIT too.
		bundle.proxy.LoseNextCommitReply()
		bundle.proxy.LoseNextCommitReply()
		var calls int
		err := tx.Run(ctx, bundle.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			if calls == 1 {
				tx.MarkIdempotent(dbtx)
			}
			return upsertItem(ctx, dbtx, 1)
		}, fastRetries)

		require.ErrorIs(t, err, tx.ErrCommitUnknown)
		require.Equal(t, 2, calls)
	})

	t.Run("UnknownSurvivesGivingUp", func(t *testing.T) {
		t.Parallel()
		bundle := setupLostCommit(t)

		// The rerun fails for another reason, and there are no attempts
		// left: whether the first COMMIT landed is still unknown.
		bundle.proxy.LoseNextCommitReply()
		var calls int
		err := tx.Run(ctx, bundle.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			tx.MarkIdempotent(dbtx)
			if calls == 2 {
				return retryableError{}
			}
			return upsertItem(ctx, dbtx, 1)
		}, tx.MaxAttempts(2), fastRetries)

		require.Equal(t, 2, calls)
		require.ErrorContains(t, err, "giving up after 2 attempts")
		require.ErrorIs(t, err, retryableError{})
		require.ErrorIs(t, err, tx.ErrCommitUnknown)
	})

	t.Run("UnknownSurvivesCancel", func(t *testing.T) {
		t.Parallel()
		bundle := setupLostCommit(t)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()

		// The context is cancelled during the rerun, before it commits:
		// whether the first COMMIT landed is still unknown.
		bundle.proxy.LoseNextCommitReply()
		var calls int
		err := tx.Run(ctx, bundle.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			tx.MarkIdempotent(dbtx)
			if calls == 2 {
				cancel()
			}
			return upsertItem(ctx, dbtx, 1)
		}, fastRetries)

		require.Equal(t, 2, calls)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, tx.ErrCommitUnknown)
	})

	t.Run("NestedMarkReachesEnclosingRun", func(t *testing.T) {
		t.Parallel()
		bundle := setupLostCommit(t)

		bundle.proxy.LoseNextCommitReply()
		var calls int
		err := tx.Run(ctx, bundle.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			return tx.Run(ctx, dbtx, func(ctx context.Context, sp pgx.Tx) error {
				tx.MarkIdempotent(sp) // as idem.Do in a savepoint would
				return upsertItem(ctx, sp, 1)
			})
		}, fastRetries)

		require.NoError(t, err)
		require.Equal(t, 2, calls)
		require.Equal(t, 1, bundle.count(t))
	})

	t.Run("RolledBackNestedMarkDoesNotCount", func(t *testing.T) {
		t.Parallel()
		bundle := setupLostCommit(t)
		errBoom := errors.New("boom")

		bundle.proxy.LoseNextCommitReply()
		var calls int
		err := tx.Run(ctx, bundle.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			err := tx.Run(ctx, dbtx, func(ctx context.Context, sp pgx.Tx) error {
				tx.MarkIdempotent(sp)
				return errBoom
			})
			require.ErrorIs(t, err, errBoom)
			// What remains is not idempotent.
			return insertItem(ctx, dbtx, 1)
		}, fastRetries)

		require.ErrorIs(t, err, tx.ErrCommitUnknown)
		require.Equal(t, 1, calls)
		require.Equal(t, 1, bundle.count(t))
	})
}

func TestRunDeadConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RetriesBeginOnDeadPooledConnection", func(t *testing.T) {
		t.Parallel()
		bundle := setupLostCommit(t)

		// Leave an idle connection in the pool, then kill it underneath.
		_, err := bundle.proxied.Exec(ctx, "SELECT 1")
		require.NoError(t, err)
		require.Equal(t, int32(1), bundle.proxied.Stat().IdleConns())
		bundle.proxy.ResetAll()

		var calls int
		err = tx.Run(ctx, bundle.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			return insertItem(ctx, dbtx, 1)
		}, fastRetries)
		require.NoError(t, err)
		// BEGIN travels with fn's first statement; both failed on the dead connection, nothing
		// of the first attempt reached the server, and the second ran on a new connection.
		require.Equal(t, 2, calls)
		require.Equal(t, 1, bundle.count(t))
		require.Equal(t, 2, bundle.proxy.Stats().Connections)
	})

	t.Run("StatementOnDeadConnectionIsNotRetried", func(t *testing.T) {
		t.Parallel()
		bundle := setupLostCommit(t)

		// A statement that fails with the connection after the transaction began is not a
		// conflict: whatever fn does about it, Run does not guess.
		var calls int
		err := tx.Run(ctx, bundle.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
			calls++
			if err := insertItem(ctx, dbtx, 2); err != nil {
				return err
			}
			bundle.proxy.ResetAll()
			return insertItem(ctx, dbtx, 1)
		}, fastRetries)
		require.Error(t, err)
		require.NotErrorIs(t, err, tx.ErrCommitUnknown)
		require.Equal(t, 1, calls)
		require.Equal(t, 0, bundle.count(t))
	})
}

// TestAfterLostCommit checks that the rerun after an unanswered COMMIT, and only the rerun, is
// told so: idem.Do waits on its strength for locks the lost attempt's backend still holds.
func TestAfterLostCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupLostCommit(t)
	b.proxy.DropNextCommit()
	var seen []bool
	err := tx.Run(ctx, b.proxied, func(ctx context.Context, dbtx pgx.Tx) error {
		a, _ := txctl.From(dbtx)
		seen = append(seen, a.Rerun)
		tx.MarkIdempotent(dbtx)
		_, err := dbtx.Exec(ctx, "INSERT INTO items (id) VALUES (1) ON CONFLICT (id) DO NOTHING")
		return err
	}, fastRetries)
	require.NoError(t, err)
	require.Equal(t, []bool{false, true}, seen)
}
