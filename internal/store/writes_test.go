package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// TestRunLeaseWritesHOT: renewing a lease and taking an expired one over change no column that an
// index of idem_runs reads, so both are heap-only (HOT) updates that write no index entry: a
// long step renews its lease many times, and each renewal used to write an entry in every index.
func TestRunLeaseWritesHOT(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := newToken()
	b.insertRun(t, run{scope: "s", id: "live", token: tok, owner: "me", lease: time.Minute})
	old := newToken()
	b.insertRun(t, run{scope: "s", id: "dead", token: old, owner: "gone", lease: -time.Second})

	tx := b.begin(t)
	ok, err := b.st.RunRenew(b.ctx, tx, store.LeaseParams{Scope: "s", ID: "live", Token: tok}, time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, ok, err = b.st.RunTakeover(b.ctx, tx, store.TakeoverParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "dead", Token: newToken()},
		Old: &old, Owner: "me", Lease: time.Minute, Version: "v2"})
	require.NoError(t, err)
	require.True(t, ok)
	// The transaction's own counts, before they are flushed to the statistics.
	var updated, hot int64
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT pg_stat_get_xact_tuples_updated('idem_runs'::regclass),
	pg_stat_get_xact_tuples_hot_updated('idem_runs'::regclass)`).Scan(&updated, &hot))
	require.Equal(t, int64(2), updated)
	require.Equal(t, int64(2), hot, "a renewal and a takeover are HOT updates")
	require.NoError(t, tx.Commit(b.ctx))
}

// TestRunScanPlan: the recovery scan, with no index on lease expiry, reads the running runs (the
// few in a table of finished ones) through idem_runs_state rather than the whole table.
func TestRunScanPlan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO idem_runs (scope, id, workflow, state, lease_expires_at, created_at)
SELECT 's', 'r' || i, 'w', CASE WHEN i % 500 = 0 THEN 'running' ELSE 'done' END,
	CASE WHEN i % 500 = 0 THEN now() + (i % 3 - 1) * interval '1 minute' END, now() - i * interval '1 second'
FROM generate_series(1, 10000) AS i;
ANALYZE idem_runs`)
	require.NoError(t, err)
	rows, err := b.st.RunScan(b.ctx, b.pool, 100)
	require.NoError(t, err)
	var expired int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_runs WHERE state = 'running' AND lease_expires_at <= now()`).Scan(&expired))
	require.Len(t, rows, expired)
	for i := 1; i < len(rows); i++ {
		require.LessOrEqual(t, rows[i-1].LeaseExpiry, rows[i].LeaseExpiry, "oldest expiry first")
	}
	x := &explainer{Querier: b.pool}
	_, err = b.st.RunScan(b.ctx, x, 100)
	require.ErrorContains(t, err, "explained")
	require.Contains(t, x.plan, "idem_runs_state", "the running runs are read from the state index:\n%s", x.plan)
}
