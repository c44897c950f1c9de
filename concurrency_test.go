package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/tx"
)

// doUntilAnswered is what a well-behaved client does: same key, same request, retry on
// ErrInFlight until it gets an answer.
func doUntilAnswered(ctx context.Context, b *testBundle, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) (receipt, error) {
	for {
		var out receipt
		err := tx.Run(ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			var err error
			out, err = idem.Do(ctx, t, k, fn)
			return err
		})
		if !errors.Is(err, idem.ErrInFlight) {
			return out, err
		}
		// Real clients honour RetryAfter; a test needs only to let the holder finish.
		time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
	}
}

func TestDoConcurrentDuplicates(t *testing.T) {
	t.Parallel()

	t.Run("OneKey64Callers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const callers = 64
		k := idem.Key{Scope: "s", ID: "one-key"}
		results := make([]receipt, callers)
		errs := make([]error, callers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-start
				results[i], errs[i] = doUntilAnswered(b.ctx, b, k, recordEffect("one-key", fmt.Sprint("caller ", i), nil))
			})
		}
		close(start)
		wg.Wait()
		for i := range callers {
			require.NoError(t, errs[i])
			require.Equal(t, results[0], results[i], "caller %d got another answer", i)
		}
		require.Equal(t, 1, b.effects(t, "one-key"))
		var winner int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id FROM effects`).Scan(&winner))
		require.Equal(t, winner, results[0].EffectID, "everyone got the committed execution's result")
	})

	t.Run("ThousandKeys8CallersEach", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const keys, callers = 1000, 8
		results := make([][callers]receipt, keys)
		sem := make(chan struct{}, 64) // goroutines at once; the pool has 16 connections
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		for k := range keys {
			for c := range callers {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					name := fmt.Sprintf("key-%04d", k)
					out, err := doUntilAnswered(b.ctx, b, idem.Key{Scope: "s", ID: name}, recordEffect(name, fmt.Sprint(c), nil))
					if err != nil {
						mu.Lock()
						firstErr = errors.Join(firstErr, err)
						mu.Unlock()
					}
					results[k][c] = out
				})
			}
		}
		wg.Wait()
		require.NoError(t, firstErr)

		var total, distinct, maxPerKey int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT key), coalesce(max(n), 0)
			FROM effects, LATERAL (SELECT count(*) AS n FROM effects e2 WHERE e2.key = effects.key) c`).Scan(&total, &distinct, &maxPerKey))
		require.Equal(t, keys, total, "exactly one effect per key")
		require.Equal(t, keys, distinct)
		require.Equal(t, 1, maxPerKey)
		for k := range keys {
			for c := 1; c < callers; c++ {
				require.Equal(t, results[k][0], results[k][c], "key %d caller %d", k, c)
			}
		}
	})
}
