package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/store"
)

// Reap and Migrate given a transaction, a wrapper or a version: partition upkeep never breaks the
// caller's transaction, never blocks large Do's, and happens wherever it can.

// attachPastPartition attaches an (empty) partition of idem_results for today+d, as the reaper
// would have made it, so that it is droppable when d <= -2.
func attachPastPartition(t *testing.T, b *testBundle, d int) (name string, today time.Time) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today))
	day := today.AddDate(0, 0, d)
	name = store.PartitionName("idem_results", day)
	require.NoError(t, store.For("").MakePartitions(b.ctx, b.pool, "idem_results", day, day))
	return name, today
}

// dropPartitionAhead drops one partition ahead, as the first Reap of every UTC day finds it
// missing (today+14 is new each day), so that Reap's createPartitions has work to do.
func dropPartitionAhead(t *testing.T, b *testBundle, today time.Time) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `DROP TABLE `+store.PartitionName("idem_results", today.AddDate(0, 0, 14)))
	require.NoError(t, err)
}

// TestReapInATransactionKeepsItsLockTimeout: Reap given the caller's transaction makes the
// partitions ahead under a 5 s lock timeout of its own, and leaves the transaction's as it was.
func TestReapInATransactionKeepsItsLockTimeout(t *testing.T) {
	b := setup(t)
	var td time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&td))
	dropPartitionAhead(t, b, td)

	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var before string
		require.NoError(t, tx.QueryRow(b.ctx, `SHOW lock_timeout`).Scan(&before))
		_, err := idem.Reap(b.ctx, tx)
		require.NoError(t, err)
		var after string
		require.NoError(t, tx.QueryRow(b.ctx, `SHOW lock_timeout`).Scan(&after))
		require.Equal(t, before, after, "Reap changed the caller's transaction's lock_timeout")
		return nil
	}))
}

// TestReapInATransactionLeavesItUsable: given a transaction, while another transaction holds
// idem_results, Reap makes partitions and leaves droppable ones for a Reap on a pool, without
// failing and without aborting the caller's transaction: its deletions commit.
func TestReapInATransactionLeavesItUsable(t *testing.T) {
	b := setup(t)
	ctx := b.ctx
	name, today := attachPastPartition(t, b, -4)
	dropPartitionAhead(t, b, today)
	_, err := b.pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, result, created_at, expires_at)
VALUES ('old', 'k', '1', now() - interval '2 days', now() - interval '1 day')`)
	require.NoError(t, err)

	// A transaction that holds an ordinary lock on idem_results, as an in-flight large Do does.
	holder, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT count(*) FROM idem_results`)
	require.NoError(t, err)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	n, reapErr := idem.Reap(ctx, tx)
	_, usable := tx.Exec(ctx, `SELECT 1`)
	commitErr := tx.Commit(ctx)
	t.Logf("Reap: n=%d err=%v; next statement: %v; commit: %v", n, reapErr, usable, commitErr)
	if reapErr == nil {
		require.NoError(t, usable, "Reap returned no error but left the caller's transaction aborted")
		require.NoError(t, commitErr)
	}
	var left int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys WHERE scope = 'old'`).Scan(&left))
	if reapErr == nil {
		require.Zero(t, left, "Reap reported %d keys reaped, none were", n)
	}
	_ = name
}

// TestReapInATransactionBlocksNoLargeDo: Reap in a transaction that stays open afterwards makes
// no large Do, fresh or replayed, wait for that transaction: it takes no lock on idem_results
// that they wait for (a plain DETACH would hold ACCESS EXCLUSIVE until the caller commits).
func TestReapInATransactionBlocksNoLargeDo(t *testing.T) {
	b := setup(t)
	ctx := b.ctx
	// A large result stored before, to replay.
	old := idem.Key{Scope: "blk", ID: "replay"}
	body := bigBody(4000, "blk")
	_, err := idem.Run(ctx, b.pool, old, func(context.Context, pgx.Tx) (string, error) { return body, nil })
	require.NoError(t, err)

	attachPastPartition(t, b, -4)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = idem.Reap(ctx, tx)
	require.NoError(t, err)
	// The caller's transaction goes on with other work for a while; Reap has returned.

	t.Run("FreshLargeDo", func(t *testing.T) {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := idem.Run(c, b.pool, idem.Key{Scope: "blk", ID: "fresh"}, func(context.Context, pgx.Tx) (string, error) {
			return bigBody(4000, "fresh"), nil
		})
		require.NoError(t, err, "a large Do waited on idem_results' ACCESS EXCLUSIVE lock held by Reap's caller")
	})
	t.Run("LargeReplay", func(t *testing.T) {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		got, err := idem.Run(c, b.pool, old, func(context.Context, pgx.Tx) (string, error) { return "", nil })
		require.NoError(t, err, "a large replay waited on idem_results' lock held by Reap's caller")
		require.Equal(t, body, got)
	})
}

// wrappedQuerier is a caller's own idem.Querier (a tracing or sqlc-style wrapper): it has
// Exec, Query and QueryRow and nothing else, which is all Reap asks for.
type wrappedQuerier struct{ q idem.Querier }

func (w wrappedQuerier) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return w.q.Exec(ctx, sql, args...)
}
func (w wrappedQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return w.q.Query(ctx, sql, args...)
}
func (w wrappedQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return w.q.QueryRow(ctx, sql, args...)
}

// TestReapThroughAWrappedTransaction: Reap takes any Querier; through a wrapper of a
// transaction (which it cannot tell from a pool) it still reaps, and leaves a droppable
// partition for a Reap on a pool instead of failing on DETACH CONCURRENTLY.
func TestReapThroughAWrappedTransaction(t *testing.T) {
	b := setup(t)
	attachPastPartition(t, b, -4)
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := idem.Reap(b.ctx, wrappedQuerier{tx})
		return err
	})
	require.NoError(t, err)
}

// TestReapThroughAWrappedPoolMakesPartitions: through a wrapper of a pool, which has no Begin,
// Reap still makes the missing partitions ahead.
func TestReapThroughAWrappedPoolMakesPartitions(t *testing.T) {
	b := setup(t)
	var today time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today))
	dropPartitionAhead(t, b, today)
	_, err := idem.Reap(b.ctx, wrappedQuerier{b.pool})
	require.NoError(t, err)
	var ok bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT to_regclass($1) IS NOT NULL`,
		store.PartitionName("idem_results", today.AddDate(0, 0, 14))).Scan(&ok))
	require.True(t, ok, "Reap through a wrapper made no partition, and said nothing")
}

// TestMigrateToMakesPartitions: MigrateTo up to the latest version makes the first partitions,
// as Migrate does.
func TestMigrateToMakesPartitions(t *testing.T) {
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	require.NoError(t, idem.MigrateTo(ctx, pool, len(idem.Migrations())))
	var parts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'idem_results'::regclass`).Scan(&parts))
	require.Equal(t, 16, parts, "MigrateTo(latest) made no partitions, unlike Migrate")
}

// TestReapWithReport: the report counts each kind of row and names the partitions made, dropped
// and left for later; Reap returns its total.
func TestReapWithReport(t *testing.T) {
	b := setup(t)
	_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: "s", ID: "gone"}, func(context.Context, pgx.Tx) (int, error) { return 1, nil })
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	old, today := attachPastPartition(t, b, -5)
	dropPartitionAhead(t, b, today)
	// Named as in SQL.
	old = pgx.Identifier{old}.Sanitize()
	ahead := pgx.Identifier{store.PartitionName("idem_results", today.AddDate(0, 0, 14))}.Sanitize()

	// In a transaction: the partition ahead is made, the old one is left, and the report says why.
	require.EqualError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		rep, err := idem.ReapWithReport(b.ctx, tx)
		require.NoError(t, err)
		require.Equal(t, idem.ReapReport{Keys: 1, PartitionsCreated: []string{ahead}, PartitionsSkipped: rep.PartitionsSkipped}, rep)
		require.NotEmpty(t, rep.PartitionsSkipped, "the old partition's drop is left for a Reap on a pool")
		require.ErrorContains(t, rep.PartitionsSkipped[0], "transaction")
		require.EqualValues(t, 1, rep.Total())
		return errors.New("roll back")
	}), "roll back")
	// On the pool, after that rollback: everything again, and the old partition goes.
	rep, err := idem.ReapWithReport(b.ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, idem.ReapReport{Keys: 1, PartitionsCreated: []string{ahead}, PartitionsDropped: []string{old}}, rep)
	n, err := idem.Reap(b.ctx, b.pool)
	require.NoError(t, err)
	require.Zero(t, n)
}
