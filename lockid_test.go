package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestLockIDFollowsTheTable: two spellings of one schema reach one table, so they must take one
// in-flight lock. With the default (unqualified, search_path's public) holding a key in flight,
// a Do that names Schema("public") must be told ErrInFlight, not run its function beside it.
func TestLockIDFollowsTheTable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		first, second []idem.Option
	}{
		{"DefaultThenPublic", nil, []idem.Option{idem.Schema("public")}},
		{"PublicThenDefault", []idem.Option{idem.Schema("public")}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			k := idem.Key{Scope: "tenant-a", ID: "aliased"}
			holder, err := b.pool.Begin(b.ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(b.ctx) }()
			_, err = idem.Do(b.ctx, holder, k, recordEffect("aliased", "first", nil), tt.first...)
			require.NoError(t, err)

			errRan := errors.New("fn ran while the key was in flight")
			err = b.inTx(t, pgx.TxOptions{}, func(tx pgx.Tx) error {
				_, err := idem.Do(b.ctx, tx, k, func(context.Context, pgx.Tx) (receipt, error) {
					return receipt{}, errRan
				}, tt.second...)
				return err
			})
			require.ErrorIs(t, err, idem.ErrInFlight)
		})
	}
}
