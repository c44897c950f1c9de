package idem_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
)

// TestRunPayloadsMigrationDown: going down from 012 moves every large step output, signal
// payload and event value back into its owner's row before idem_run_payloads goes, with its
// partitions: nothing is lost.
func TestRunPayloadsMigrationDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	require.NoError(t, idem.Migrate(ctx, pool))
	big := bytes.Repeat([]byte("x"), 5000)
	_, err := pool.Exec(ctx, `
WITH day AS (SELECT (now() AT TIME ZONE 'UTC')::date AS d),
p AS (
	INSERT INTO idem_run_payloads (day, scope, id, kind, ref, data)
	SELECT d, 's', 'r', k, ref, $1 FROM day, (VALUES ('s'::"char", '1'), ('g', '7'), ('e', 'ev')) AS v(k, ref)
), steps AS (
	INSERT INTO idem_steps (scope, id, seq, name, kind, output_day) SELECT 's', 'r', 1, 'one', 'tx', d FROM day
), small AS (
	INSERT INTO idem_steps (scope, id, seq, name, kind, output) VALUES ('s', 'r', 2, 'two', 'tx', '"small"')
), signals AS (
	INSERT INTO idem_signals (scope, id, seq, name, payload_day) SELECT 's', 'r', 7, 'sig', d FROM day
)
INSERT INTO idem_events (scope, id, name, value_day) SELECT 's', 'r', 'ev', d FROM day`, big)
	require.NoError(t, err)

	require.NoError(t, idem.MigrateTo(ctx, pool, 11))
	var step1, step2, sig, ev []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT output FROM idem_steps WHERE seq = 1), (SELECT output FROM idem_steps WHERE seq = 2),
	(SELECT payload FROM idem_signals), (SELECT value FROM idem_events)`).Scan(&step1, &step2, &sig, &ev))
	require.Equal(t, big, step1)
	require.Equal(t, []byte(`"small"`), step2)
	require.Equal(t, big, sig)
	require.Equal(t, big, ev)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'idem\_run\_payloads%'`).Scan(&left))
	require.Zero(t, left, "the table and its partitions are gone")

	require.NoError(t, idem.Migrate(ctx, pool))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'idem\_run\_payloads\_p%'`).Scan(&left))
	require.Positive(t, left, "up again, Migrate makes the partitions")
}
