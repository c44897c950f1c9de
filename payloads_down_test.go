package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestMigrateDownKeepsAResultCommittedDuringIt: a large Do that commits while migration 010 is
// being reverted keeps its result: the down migration locks idem_keys and idem_results before it
// moves the results back into their keys' rows, so none can commit between the move and the
// drop.
func TestMigrateDownKeepsAResultCommittedDuringIt(t *testing.T) {
	b := setup(t)
	ctx := b.ctx
	key := idem.Key{Scope: "down", ID: "racing"}
	body := bigBody(6000, "racing")

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = idem.Do(ctx, tx, key, func(context.Context, pgx.Tx) (string, error) { return body, nil })
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- idem.MigrateTo(ctx, b.pool, 9) }()
	// Wait until the down migration is blocked on idem_keys (after its UPDATE).
	require.Eventually(t, func() bool {
		var waiting bool
		_ = b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
			WHERE NOT l.granted AND c.relname IN ('idem_keys', 'idem_results'))`).Scan(&waiting)
		return waiting
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)

	var result []byte
	var live bool
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT result, expires_at > now() FROM idem_keys WHERE scope = $1 AND id = $2`,
		key.Scope, key.ID).Scan(&result, &live))
	require.True(t, live)
	require.NotNil(t, result, "a live key's large result was lost by the down migration")
}
