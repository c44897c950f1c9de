package idem_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/tx"
)

// TestMissingTables: on a database where idem.Migrate never ran, every function of the root
// package that reads or writes idem's tables says to run idem.Migrate, instead of giving
// Postgres's "relation does not exist".
func TestMissingTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	key := idem.Key{Scope: "s", ID: "k"}
	fn := func(context.Context, pgx.Tx) (int, error) { return 1, nil }
	for name, call := range map[string]func() error{
		"Run": func() error { _, err := idem.Run(ctx, pool, key, fn); return err },
		"Do": func() error {
			return pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error { _, err := idem.Do(ctx, t, key, fn); return err })
		},
		"DoInTxRun": func() error {
			return tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error { _, err := idem.Do(ctx, t, key, fn); return err })
		},
		"KeyGet":    func() error { _, err := idem.KeyGet(ctx, pool, key); return err },
		"KeyDelete": func() error { return idem.KeyDelete(ctx, pool, key) },
		"KeyList":   func() error { _, err := idem.KeyList(ctx, pool, &idem.KeyListParams{Scope: "s"}); return err },
		"Reap":      func() error { _, err := idem.Reap(ctx, pool); return err },
	} {
		require.ErrorContains(t, call(), "idem's tables are missing", name)
		require.ErrorContains(t, call(), "run idem.Migrate", name)
	}
}
