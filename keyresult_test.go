package idem_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestKeyResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: "s", ID: "k1"}, recordEffect("k1", "n", nil))
	require.NoError(t, err)
	var stored []byte
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT result FROM idem_keys WHERE id = 'k1'`).Scan(&stored))

	result, err := idem.KeyResult(b.ctx, b.pool, idem.Key{Scope: "s", ID: "k1"})
	require.NoError(t, err)
	require.Equal(t, json.RawMessage(stored), result, "the stored bytes")
	require.Equal(t, 1, b.effects(t, "k1"), "reading ran nothing")

	_, err = idem.KeyResult(b.ctx, b.pool, idem.Key{Scope: "other", ID: "k1"})
	require.ErrorIs(t, err, idem.ErrNotFound, "scopes never see each other's keys")
	_, err = idem.KeyResult(b.ctx, b.pool, idem.Key{Scope: "s", ID: "has space"})
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	_, err = idem.KeyResult(b.ctx, nil, idem.Key{Scope: "s", ID: "k1"})
	require.ErrorContains(t, err, "db is nil")

	b.seedRun(t, "s", "run-1", "payout", "done", "now() + interval '1 hour'")
	_, err = idem.KeyResult(b.ctx, b.pool, idem.Key{Scope: "s", ID: "run-1"})
	require.ErrorContains(t, err, `belongs to a run of workflow "payout"`)

	_, err = idem.KeyResult(b.ctx, b.pool, idem.Key{Scope: "s", ID: "k1"}, idem.Schema("nowhere"))
	require.ErrorContains(t, err, "idem's tables are missing")
}
