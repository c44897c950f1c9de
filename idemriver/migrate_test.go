package idemriver_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemriver"
	"github.com/idemkit/idem/internal/pgtemp"
)

// TestMigrateConcurrently: processes that start at once on a new database, each migrating idem's
// tables and River's through Migrate on connections of its own, all start, and leave both schemas
// current and no lock behind. (River's migrator alone takes no lock, and concurrent starts race
// on its CREATE statements.)
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  *idemriver.MigrateConfig
	}{
		{"Default", &idemriver.MigrateConfig{Logger: quiet()}},
		{"Schemas", &idemriver.MigrateConfig{Options: []idem.Option{idem.Schema("idem")}, RiverSchema: "river", Logger: quiet()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for round := range 3 {
				url := pgtemp.NewDB(t)
				const processes = 4
				pools := make([]*pgxpool.Pool, processes)
				for i := range pools {
					pool, err := pgxpool.New(context.Background(), url)
					require.NoError(t, err)
					t.Cleanup(pool.Close)
					pools[i] = pool
				}
				start := make(chan struct{})
				errs := make(chan error, processes)
				var wg sync.WaitGroup
				for _, pool := range pools {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						errs <- idemriver.Migrate(context.Background(), pool, tc.cfg)
					}()
				}
				close(start)
				wg.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err, "round %d", round)
				}

				// Both schemas are current, and a later start changes nothing.
				ctx := context.Background()
				var opts []idem.Option
				riverCfg := &rivermigrate.Config{Logger: quiet()}
				opts, riverCfg.Schema = tc.cfg.Options, tc.cfg.RiverSchema
				v, err := idem.SchemaVersion(ctx, pools[0], opts...)
				require.NoError(t, err)
				require.Equal(t, len(idem.Migrations()), v)
				migrator, err := rivermigrate.New(riverpgxv5.New(pools[0]), riverCfg)
				require.NoError(t, err)
				res, err := migrator.Validate(ctx, nil)
				require.NoError(t, err)
				require.True(t, res.OK, res.Messages)
				require.NoError(t, idemriver.Migrate(ctx, pools[1], tc.cfg))
				var locks int
				require.NoError(t, pools[0].QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE l.locktype = 'advisory' AND d.datname = current_database()`).Scan(&locks))
				require.Zero(t, locks, "the lock is released")
			}
		})
	}
}

func TestMigrateArguments(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, idemriver.Migrate(context.Background(), nil, nil), "pool is nil")
	pool := pgtemp.NewPool(t)
	err := idemriver.Migrate(context.Background(), pool, &idemriver.MigrateConfig{Options: []idem.Option{idem.TTL(0)}})
	require.ErrorContains(t, err, "TTL cannot be less than one second")
	v, err := idem.SchemaVersion(context.Background(), pool)
	require.NoError(t, err)
	require.Zero(t, v, "nothing migrated")
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }
