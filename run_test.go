package idem_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/roundtrip"
	"github.com/idemkit/idem/tx"
)

func TestRun(t *testing.T) {
	t.Parallel()

	key := idem.Key{Scope: "tenant-a", ID: "k1"}

	t.Run("RunsOnceAndReplays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ran := 0
		first, err := idem.Run(b.ctx, b.pool, key, recordEffect("k1", "first", &ran))
		require.NoError(t, err)
		again, err := idem.Run(b.ctx, b.pool, key, recordEffect("k1", "second", &ran))
		require.NoError(t, err)
		require.Equal(t, first, again)
		require.Equal(t, 1, ran)
		require.Equal(t, 1, b.effects(t, "k1"))
		// Do and Run share keys.
		err = b.inTx(t, pgx.TxOptions{}, func(tx pgx.Tx) error {
			viaDo, err := idem.Do(b.ctx, tx, key, recordEffect("k1", "third", &ran))
			require.Equal(t, first, viaDo)
			return err
		})
		require.NoError(t, err)
		require.Equal(t, 1, ran)
	})

	t.Run("ErrorRollsBackEverything", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		boom := errors.New("declined")
		_, err := idem.Run(b.ctx, b.pool, key, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
			_, err := recordEffect("k1", "x", nil)(ctx, tx)
			require.NoError(t, err)
			return receipt{}, boom
		})
		require.ErrorIs(t, err, boom)
		require.Equal(t, 0, b.effects(t, "k1"))
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_keys`).Scan(&n))
		require.Equal(t, 0, n)
		// The connection went back to the pool clean: the next Run works.
		_, err = idem.Run(b.ctx, b.pool, key, recordEffect("k1", "x", nil))
		require.NoError(t, err)
		require.Equal(t, 1, b.effects(t, "k1"))
	})

	t.Run("MismatchAndInFlight", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		k := key
		k.Fingerprint = idem.Fingerprint("a")
		_, err := idem.Run(b.ctx, b.pool, k, recordEffect("k1", "x", nil))
		require.NoError(t, err)
		k.Fingerprint = idem.Fingerprint("b")
		_, err = idem.Run(b.ctx, b.pool, k, recordEffect("k1", "x", nil))
		require.ErrorIs(t, err, idem.ErrMismatch)

		other := idem.Key{Scope: "tenant-a", ID: "k2"}
		holder, release := holdKey(t, b, other)
		ran := 0
		_, err = idem.Run(b.ctx, b.pool, other, recordEffect("k2", "dup", &ran))
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.Equal(t, 0, ran)
		release(true)
		require.NoError(t, <-holder)
		out, err := idem.Run(b.ctx, b.pool, other, recordEffect("k2", "dup", &ran))
		require.NoError(t, err)
		require.Equal(t, "holder", out.Note)
	})

	t.Run("LostRaceIsRetriedAndReplays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		attempts := 0
		out, err := idem.Run(b.ctx, b.pool, key, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
			attempts++
			if attempts == 1 {
				_, err := b.pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, result, expires_at) VALUES ('tenant-a', 'k1', '{"note":"racer"}', now() + interval '1 hour')`)
				require.NoError(t, err)
			}
			return recordEffect("k1", "late", nil)(ctx, tx)
		})
		require.NoError(t, err)
		require.Equal(t, "racer", out.Note)
		require.Equal(t, 1, attempts, "the retry replays; fn does not run again")
		require.Equal(t, 0, b.effects(t, "k1"))
	})

	t.Run("SavepointsAndOwnership", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := idem.Run(b.ctx, b.pool, key, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
			require.Error(t, tx.Commit(ctx), "fn cannot commit Run's transaction")
			require.Error(t, tx.Rollback(ctx), "fn cannot roll back Run's transaction")
			// A failed savepoint is undone without losing the transaction.
			err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				_, err := recordEffect("k1", "undone", nil)(ctx, sp)
				require.NoError(t, err)
				return errors.New("undo")
			})
			require.Error(t, err)
			require.NoError(t, pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				_, err := recordEffect("k1", "kept", nil)(ctx, sp)
				return err
			}))
			return receipt{Note: "ok"}, nil
		})
		require.NoError(t, err)
		var notes []string
		rows, err := b.pool.Query(b.ctx, `SELECT note FROM effects`)
		require.NoError(t, err)
		notes, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{"kept"}, notes)
	})

	t.Run("IsolationIsApplied", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
			got, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: "s", ID: string(iso[:4])}, func(ctx context.Context, tx pgx.Tx) (string, error) {
				var level string
				err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&level)
				return level, err
			}, idem.Isolation(iso))
			require.NoError(t, err)
			require.Equal(t, string(iso), got)
		}
	})

	t.Run("AnyBeginnerWorks", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ran := 0
		outer, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		first, err := idem.Run(b.ctx, outer, key, recordEffect("k1", "x", &ran))
		require.NoError(t, err)
		again, err := idem.Run(b.ctx, outer, key, recordEffect("k1", "x", &ran))
		require.NoError(t, err)
		require.Equal(t, first, again)
		require.NoError(t, outer.Commit(b.ctx))
		require.Equal(t, 1, ran)
		require.Equal(t, 1, b.effects(t, "k1"))
	})

	t.Run("PanicInFnLeavesNothingHeld", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		conn, err := b.pool.Acquire(b.ctx)
		require.NoError(t, err)
		defer conn.Release()
		func() {
			defer func() { require.Equal(t, "boom", recover()) }()
			_, _ = idem.Run(b.ctx, conn.Conn(), key, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
				_, err := recordEffect("k1", "half done", nil)(ctx, tx)
				require.NoError(t, err)
				panic("boom")
			})
		}()
		require.Equal(t, byte('I'), conn.Conn().PgConn().TxStatus(), "the transaction was rolled back")
		// The key is free for anyone, and the half-done write is gone.
		out, err := idem.Run(b.ctx, b.pool, key, recordEffect("k1", "whole", nil))
		require.NoError(t, err)
		require.Equal(t, "whole", out.Note)
		require.Equal(t, 1, b.effects(t, "k1"))
	})

	t.Run("ConnAlreadyInATransactionIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		conn, err := b.pool.Acquire(b.ctx)
		require.NoError(t, err)
		defer conn.Release()
		outer, err := conn.Begin(b.ctx)
		require.NoError(t, err)
		_, err = idem.Run(b.ctx, conn.Conn(), key, recordEffect("k1", "x", nil))
		require.ErrorContains(t, err, "already in a transaction")
		require.NoError(t, outer.Rollback(b.ctx))
		require.Equal(t, 0, b.effects(t, "k1"))
	})

	t.Run("TxIsClosedAfterFnReturns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var kept pgx.Tx
		_, err := idem.Run(b.ctx, b.pool, key, func(ctx context.Context, tx pgx.Tx) (int, error) {
			kept = tx
			return 1, nil
		})
		require.NoError(t, err)
		_, err = kept.Exec(b.ctx, `INSERT INTO effects (key) VALUES ('leaked')`)
		require.ErrorIs(t, err, pgx.ErrTxClosed)
		require.Equal(t, 0, b.effects(t, "leaked"))
	})

	t.Run("WaitReplays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		holder, release := holdKey(t, b, key)
		ran := 0
		waiter := make(chan error, 1)
		var out receipt
		go func() {
			var err error
			out, err = idem.Run(b.ctx, b.pool, key, recordEffect("tenant-a/k1", "waiter", &ran), idem.Wait(30*time.Second))
			waiter <- err
		}()
		waitForWaiter(t, b)
		release(true)
		require.NoError(t, <-holder)
		require.NoError(t, <-waiter)
		require.Equal(t, "holder", out.Note)
		require.Equal(t, 0, ran)
	})

	t.Run("Concurrent64", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const callers = 64
		results := make([]receipt, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				for {
					out, err := idem.Run(b.ctx, b.pool, key, recordEffect("k1", "x", nil))
					if errors.Is(err, idem.ErrInFlight) {
						// A client's pause before it asks again (a real one honours RetryAfter);
						// nothing waits on it, and the outcome does not depend on its length.
						runtime.Gosched()
						continue
					}
					results[i], errs[i] = out, err
					return
				}
			})
		}
		wg.Wait()
		for i := range callers {
			require.NoError(t, errs[i], "caller %d", i)
		}
		require.Equal(t, 1, b.effects(t, "k1"))
		for i := range callers {
			require.Equal(t, results[0], results[i])
		}
	})
}

// TestRoundTrips counts the round trips each path makes on a real connection, because the
// claims in Do's and Run's documentation are about exactly that.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	counter := &roundtrip.Counter{}
	cfg := b.pool.Config().ConnConfig.Copy()
	cfg.DialFunc = counter.Dial
	conn, err := pgx.ConnectConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })

	work := func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, "x")
		return 1, err
	}
	bare := func() error {
		return pgx.BeginFunc(b.ctx, conn, func(tx pgx.Tx) error { _, err := work(b.ctx, tx); return err })
	}
	viaDo := func(id string) func() error {
		return func() error {
			return pgx.BeginFunc(b.ctx, conn, func(tx pgx.Tx) error {
				_, err := idem.Do(b.ctx, tx, idem.Key{Scope: "s", ID: id}, work)
				return err
			})
		}
	}
	viaRun := func(id string) func() error {
		return func() error { _, err := idem.Run(b.ctx, conn, idem.Key{Scope: "s", ID: id}, work); return err }
	}
	txBare := func() error {
		return tx.Run(b.ctx, conn, func(ctx context.Context, t pgx.Tx) error { _, err := work(ctx, t); return err })
	}
	viaTxDo := func(id string) func() error {
		return func() error {
			return tx.Run(b.ctx, conn, func(ctx context.Context, t pgx.Tx) error {
				_, err := idem.Do(ctx, t, idem.Key{Scope: "s", ID: id}, work)
				return err
			})
		}
	}
	// Warm pgx's statement cache, as any long-lived connection has.
	for _, f := range []func() error{bare, txBare, viaDo("warm-do"), viaRun("warm-run"), viaRun("warm-do"), viaTxDo("warm-tx"), viaTxDo("warm-tx")} {
		require.NoError(t, f())
	}
	trips := func(f func() error) int {
		counter.Reset()
		require.NoError(t, f())
		n, _ := counter.Counts()
		return n
	}

	base := trips(bare)
	require.Equal(t, 3, base, "BEGIN, INSERT, COMMIT")
	require.Equal(t, base+2, trips(viaDo("d1")), "Do adds at most two round trips when fresh")
	require.Equal(t, 3, trips(viaDo("d1")), "a replay inside a caller's transaction is BEGIN, lookup, COMMIT")
	require.Equal(t, base, trips(viaRun("r1")), "Run adds no round trip to the transaction")
	require.Equal(t, 2, trips(viaRun("r1")), "a replay through Run is two round trips")

	// tx.Run sends BEGIN with the first statement, and the writes queued by Do with COMMIT.
	require.Equal(t, 2, trips(txBare), "tx.Run: BEGIN with the INSERT, then COMMIT")
	require.Equal(t, 3, trips(viaTxDo("t1")), "Do in tx.Run: BEGIN with the lookup, fn's INSERT, the key with COMMIT")
	require.Equal(t, 2, trips(viaTxDo("t1")), "a replay in tx.Run: BEGIN with the lookup, then COMMIT")
	require.Equal(t, 0, trips(func() error {
		return tx.Run(b.ctx, conn, func(context.Context, pgx.Tx) error { return nil })
	}), "a transaction that sends nothing costs nothing")
	require.Equal(t, 3, trips(func() error {
		return tx.Run(b.ctx, conn, func(ctx context.Context, t pgx.Tx) error {
			_, err := t.Exec(ctx, `INSERT INTO effects (key) VALUES ('x')`)
			return err
		})
	}), "a first statement without arguments may hold several statements, which a batch cannot: BEGIN goes alone")
}

// TestRunBackoff: Run waits between attempts as its Backoff option says, being tx.Run inside.
func TestRunBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conflict := func(context.Context, pgx.Tx) (int, error) {
		return 0, &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
	}
	k := idem.Key{Scope: "s", ID: "backoff"}

	_, err := idem.Run(b.ctx, b.pool, k, conflict, idem.MaxAttempts(3), idem.Backoff(0, 0))
	require.ErrorContains(t, err, "giving up after 3 attempts")

	ctx, cancel := context.WithTimeout(b.ctx, 500*time.Millisecond)
	defer cancel()
	_, err = idem.Run(ctx, b.pool, k, conflict, idem.MaxAttempts(3), idem.Backoff(time.Hour, time.Hour))
	require.ErrorIs(t, err, context.DeadlineExceeded, "the wait before the second attempt outlasts the context")

	_, err = idem.Run(b.ctx, b.pool, k, conflict, idem.Backoff(time.Second, time.Millisecond))
	require.ErrorContains(t, err, "Backoff")
}
