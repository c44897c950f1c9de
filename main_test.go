package idem_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

// setup gives each test its own database with idem migrated and a table of effects, so that
// tests count what really happened instead of trusting return values.
func setup(t testing.TB) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	require.NoError(t, idem.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL, note text)`)
	require.NoError(t, err)
	return &testBundle{ctx: ctx, pool: pool}
}

// effects counts the business rows written for key.
func (b *testBundle) effects(t testing.TB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects WHERE key = $1`, key).Scan(&n))
	return n
}

type receipt struct {
	EffectID int64    `json:"effect_id"`
	Note     string   `json:"note"`
	Tags     []string `json:"tags"`
}

// recordEffect is the business work used throughout: one row per execution.
func recordEffect(key, note string, ran *int) func(context.Context, pgx.Tx) (receipt, error) {
	return func(ctx context.Context, t pgx.Tx) (receipt, error) {
		if ran != nil {
			*ran++
		}
		r := receipt{Note: note, Tags: []string{"a", "b"}}
		err := t.QueryRow(ctx, `INSERT INTO effects (key, note) VALUES ($1, $2) RETURNING id`, key, note).Scan(&r.EffectID)
		return r, err
	}
}

// inTx runs f in a transaction of its own and commits when f succeeds.
func (b *testBundle) inTx(t testing.TB, opts pgx.TxOptions, f func(pgx.Tx) error) error {
	t.Helper()
	return pgx.BeginTxFunc(b.ctx, b.pool, opts, f)
}

// seedRun writes a workflow run as package workflow stores one: its key, its row and one step.
// expires is SQL for the run's expiry (NULL while running).
func (b *testBundle) seedRun(t testing.TB, scope, id, workflow, state, expires string) {
	t.Helper()
	batch := &pgx.Batch{}
	batch.Queue(`INSERT INTO idem_keys (scope, id, workflow, expires_at) VALUES ($1, $2, $3, 'infinity')`, scope, id, workflow)
	batch.Queue(`INSERT INTO idem_runs (scope, id, workflow, state, output, expires_at) VALUES ($1, $2, $3, $4, '{}', `+expires+`)`, scope, id, workflow, state)
	batch.Queue(`INSERT INTO idem_steps (scope, id, seq, name, kind, output) VALUES ($1, $2, 1, 'reserve', 'tx', '{}')`, scope, id)
	require.NoError(t, b.pool.SendBatch(b.ctx, batch).Close())
}
