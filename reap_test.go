package idem_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestReap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// seedKeys writes n keys of Do whose expiry is expires (SQL), named prefix-1..n.
	seedKeys := func(t *testing.T, b *testBundle, prefix string, n int, expires string) {
		t.Helper()
		_, err := b.pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, result, expires_at)
			SELECT 's', $1 || '-' || i, '{}', `+expires+` FROM generate_series(1, $2::int) i`, prefix, n)
		require.NoError(t, err)
	}
	left := func(t *testing.T, b *testBundle, sql string) int {
		t.Helper()
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}

	t.Run("DeletesWhatExpiredAndKeepsTheRest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seedKeys(t, b, "do-expired", 1200, "now() - interval '1 second'")
		seedKeys(t, b, "do-live", 10, "now() + interval '1 hour'")
		b.seedRun(t, "s", "run-done-expired", "payout", "done", "now() - interval '1 second'")
		b.seedRun(t, "s", "run-failed-expired", "payout", "failed", "now() - interval '1 second'")
		b.seedRun(t, "s", "run-done-live", "payout", "done", "now() + interval '1 hour'")
		// A running run has no expiry; even one given an expiry by hand is not reaped.
		b.seedRun(t, "s", "run-running", "payout", "running", "NULL")

		n, err := idem.Reap(ctx, b.pool, idem.ReapBusy(1))
		require.NoError(t, err)
		require.EqualValues(t, 1200+2, n)
		require.Equal(t, 10+2, left(t, b, `SELECT count(*) FROM idem_keys`))
		require.Zero(t, left(t, b, `SELECT count(*) FROM idem_keys WHERE id LIKE 'do-expired-%' OR id LIKE '%expired'`))
		require.Equal(t, 2, left(t, b, `SELECT count(*) FROM idem_runs`))
		require.Equal(t, 2, left(t, b, `SELECT count(*) FROM idem_steps`), "steps go with their run")
		require.Equal(t, 1, left(t, b, `SELECT count(*) FROM idem_runs WHERE id = 'run-running'`))

		n, err = idem.Reap(ctx, b.pool)
		require.NoError(t, err)
		require.Zero(t, n, "nothing left to reap")
	})

	t.Run("BigBatchesTakeOnlyWhatExpired", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Live and expired keys side by side on the same heap pages, in batches of thousands
		// (ReapBatchTime of a second): only the rows the expiry index found are deleted.
		_, err := b.pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, result, expires_at)
			SELECT 's', 'k-' || i, '{}', CASE WHEN i % 3 = 0 THEN now() + interval '1 hour' ELSE now() - interval '1 second' END
			FROM generate_series(1, 30000) i`)
		require.NoError(t, err)
		n, err := idem.Reap(ctx, b.pool, idem.ReapBusy(1), idem.ReapBatchTime(time.Second))
		require.NoError(t, err)
		require.EqualValues(t, 20000, n)
		require.Equal(t, 10000, left(t, b, `SELECT count(*) FROM idem_keys WHERE expires_at > now()`))
		require.Zero(t, left(t, b, `SELECT count(*) FROM idem_keys WHERE expires_at <= now()`))
	})

	t.Run("AnExpiredKeyIsNewEvenBeforeReap", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		k := idem.Key{Scope: "s", ID: "k1"}
		ran := 0
		do := func(note string) error {
			return b.inTx(t, pgx.TxOptions{}, func(tx pgx.Tx) error {
				_, err := idem.Do(ctx, tx, k, recordEffect("k1", note, &ran))
				return err
			})
		}
		require.NoError(t, do("first"))
		_, err := b.pool.Exec(ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 second'`)
		require.NoError(t, err)
		n, err := idem.Reap(ctx, b.pool)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		require.NoError(t, do("second"))
		require.Equal(t, 2, ran, "a reaped key runs afresh")
	})

	t.Run("ReapMaxBoundsOneCall", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seedKeys(t, b, "k", 300, "now() - interval '1 second'")
		n, err := idem.Reap(ctx, b.pool, idem.ReapMax(120), idem.ReapBusy(1))
		require.NoError(t, err)
		require.EqualValues(t, 120, n)
		require.Equal(t, 180, left(t, b, `SELECT count(*) FROM idem_keys`))
	})

	t.Run("StopsWhenTheContextEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seedKeys(t, b, "k", 50, "now() - interval '1 second'")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		n, err := idem.Reap(cctx, b.pool)
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, n)
		require.Equal(t, 50, left(t, b, `SELECT count(*) FROM idem_keys`))
	})

	t.Run("ConcurrentReapersShareTheWork", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seedKeys(t, b, "k", 20000, "now() - interval '1 second'")
		for i := range 50 {
			b.seedRun(t, "s", fmt.Sprintf("run-%d", i), "payout", "done", "now() - interval '1 second'")
		}
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			total int64
			errs  []error
		)
		for range 4 {
			wg.Go(func() {
				// Small batches, no rest: the reapers meet on the same rows as often as can be.
				n, err := idem.Reap(ctx, b.pool, idem.ReapBusy(1), idem.ReapBatchTime(time.Millisecond))
				mu.Lock()
				total += n
				errs = append(errs, err)
				mu.Unlock()
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err, "no reaper fails or deadlocks")
		}
		// A reaper that found a batch short (its neighbours held the rest) stops; one more
		// pass gets whatever that left.
		n, err := idem.Reap(ctx, b.pool)
		require.NoError(t, err)
		require.EqualValues(t, 20000+50, total+n, "every key is deleted once")
		require.Zero(t, left(t, b, `SELECT count(*) FROM idem_keys`))
		require.Zero(t, left(t, b, `SELECT count(*) FROM idem_steps`))
	})

	t.Run("LeavesAKeyInFlightAlone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seedKeys(t, b, "k", 1, "now() - interval '1 second'")
		// A Do is replacing the expired key right now: its row is locked by the transaction.
		holder, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(ctx) }()
		ran := 0
		_, err = idem.Do(ctx, holder, idem.Key{Scope: "s", ID: "k-1"}, recordEffect("k-1", "new", &ran))
		require.NoError(t, err)
		n, err := idem.Reap(ctx, b.pool)
		require.NoError(t, err, "the reaper skips the locked row instead of waiting for it")
		require.Zero(t, n)
		require.NoError(t, holder.Commit(ctx))
		require.Equal(t, 1, left(t, b, `SELECT count(*) FROM idem_keys WHERE expires_at > now()`))
	})

	t.Run("InASchemaOfItsOwn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, idem.Migrate(ctx, b.pool, idem.Schema("tenant")))
		_, err := b.pool.Exec(ctx, `INSERT INTO tenant.idem_keys (scope, id, expires_at) VALUES ('s', 'k', now() - interval '1 second')`)
		require.NoError(t, err)
		seedKeys(t, b, "public", 1, "now() - interval '1 second'")
		n, err := idem.Reap(ctx, b.pool, idem.Schema("tenant"))
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		require.Equal(t, 1, left(t, b, `SELECT count(*) FROM public.idem_keys`), "another schema's keys are not touched")
	})

	t.Run("BadOptionsAreRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, opt := range []idem.Option{idem.ReapMax(-1), idem.ReapBusy(0), idem.ReapBusy(1.5), idem.ReapBatchTime(0)} {
			_, err := idem.Reap(ctx, b.pool, opt)
			require.Error(t, err)
			require.Contains(t, err.Error(), "Reap")
		}
		_, err := idem.Reap(ctx, nil)
		require.ErrorContains(t, err, "db is nil")
	})
}

// TestReapDrainsPastAHeldChild: a finished child whose parent is unfinished is kept, and the batch
// it was in counts as full all the same: one Reap deletes every expired run after it.
func TestReapDrainsPastAHeldChild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.seedRun(t, "s", "parent", "payout", "running", "NULL")
	b.seedRun(t, "s", "child", "payout", "done", "now() - interval '1 hour'")
	_, err := b.pool.Exec(ctx, `UPDATE idem_runs SET parent_scope = 's', parent_id = 'parent', parent_seq = 1,
	finished_at = now() - interval '2 hours' WHERE id = 'child'`)
	require.NoError(t, err)
	for i := range 150 { // more than the first batch of 100
		b.seedRun(t, "s", fmt.Sprintf("done-%d", i), "payout", "done", "now() - interval '1 second'")
	}
	rep, err := idem.ReapWithReport(ctx, b.pool, idem.ReapBusy(1))
	require.NoError(t, err)
	require.EqualValues(t, 150, rep.Runs)
	var left int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM idem_runs WHERE expires_at <= now()`).Scan(&left))
	require.Zero(t, left, "every expired run went in one Reap")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE id = 'child'`), "the child is kept for its parent")
}
