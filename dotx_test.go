package idem_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/tx"
)

// TestDoInTxRun covers what Do does differently in a transaction of tx.Run's, whose key write
// waits to go with COMMIT.
func TestDoInTxRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SameKeyTwiceInOneTransactionRunsOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ran := 0
		var first, second receipt
		k := idem.Key{Scope: "s", ID: "twice", Fingerprint: idem.Fingerprint("a")}
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			var err error
			if first, err = idem.Do(ctx, t, k, recordEffect("twice", "x", &ran)); err != nil {
				return err
			}
			second, err = idem.Do(ctx, t, k, recordEffect("twice", "y", &ran))
			return err
		}))
		require.Equal(t, 1, ran)
		require.Equal(t, first, second)
		require.Equal(t, 1, b.effects(t, "twice"))

		err := tx.Run(ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			k2 := idem.Key{Scope: "s", ID: "other", Fingerprint: idem.Fingerprint("a")}
			if _, err := idem.Do(ctx, t, k2, recordEffect("other", "x", &ran)); err != nil {
				return err
			}
			k2.Fingerprint = idem.Fingerprint("b")
			_, err := idem.Do(ctx, t, k2, recordEffect("other", "y", &ran))
			return err
		})
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.Zero(t, b.effects(t, "other"), "the transaction rolled back")
	})

	t.Run("RaceLostAtCommitIsRetriedAndReplays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		k := idem.Key{Scope: "s", ID: "race"}
		// Under REPEATABLE READ, a duplicate that commits after this transaction's snapshot is
		// invisible to its lookup: this one runs fn, its INSERT (sent with COMMIT) hits the
		// stored key, the transaction rolls back, and tx.Run's next attempt replays.
		ran, attempts := 0, 0
		var out receipt
		var winnerErr error
		require.NoError(t, tx.Run(ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			attempts++
			if _, err := t.Exec(ctx, "SELECT $1::int", 1); err != nil { // takes the snapshot
				return err
			}
			if attempts == 1 {
				_, winnerErr = idem.Run(context.Background(), b.pool, k, recordEffect("race", "winner", nil))
			}
			var err error
			out, err = idem.Do(ctx, t, k, recordEffect("race", "loser", &ran))
			return err
		}, tx.Isolation(pgx.RepeatableRead)))
		require.NoError(t, winnerErr)
		require.Equal(t, 2, attempts)
		require.Equal(t, 1, ran, "the loser ran once, and its effect rolled back")
		require.Equal(t, "winner", out.Note)
		require.Equal(t, 1, b.effects(t, "race"))
	})
}

// TestOptimistic covers Do without the lookup before fn.
func TestOptimistic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("FreshThenReplay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		k := idem.Key{Scope: "s", ID: "o1"}
		ran := 0
		first, err := idem.Run(ctx, b.pool, k, recordEffect("o1", "first", &ran), idem.Optimistic())
		require.NoError(t, err)
		require.Equal(t, 1, ran)
		again, err := idem.Run(ctx, b.pool, k, recordEffect("o1", "again", &ran), idem.Optimistic())
		require.NoError(t, err)
		require.Equal(t, first, again, "the retry replays")
		require.Equal(t, 2, ran, "after running fn once more, rolled back")
		require.Equal(t, 1, b.effects(t, "o1"))
	})

	t.Run("ConcurrentDuplicatesMakeOneEffect", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		k := idem.Key{Scope: "s", ID: "o2"}
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			outs []receipt
			errs []error
		)
		for range 16 {
			wg.Go(func() {
				out, err := idem.Run(ctx, b.pool, k, recordEffect("o2", "x", nil), idem.Optimistic())
				mu.Lock()
				outs, errs = append(outs, out), append(errs, err)
				mu.Unlock()
			})
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "duplicates wait at the INSERT instead of getting ErrInFlight")
			require.Equal(t, outs[0], outs[i])
		}
		require.Equal(t, 1, b.effects(t, "o2"))
	})

	t.Run("OutsideTxRunItLooksFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		k := idem.Key{Scope: "s", ID: "o3"}
		ran := 0
		for range 2 {
			require.NoError(t, b.inTx(t, pgx.TxOptions{}, func(t pgx.Tx) error {
				_, err := idem.Do(ctx, t, k, recordEffect("o3", "x", &ran), idem.Optimistic())
				return err
			}))
		}
		require.Equal(t, 1, ran, "no tx.Run to retry a lost race, so Do keeps its lookup")
	})
}
