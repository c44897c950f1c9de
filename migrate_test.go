package idem_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			var opts []idem.Option
			if i%2 == 1 {
				opts = append(opts, idem.Schema("other"))
			}
			errs <- idem.Migrate(ctx, pool, opts...)
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'idem_keys'`).Scan(&n))
	require.Equal(t, 2, n, "one table in public, one in the other schema")
}

// TestMigrateLeavesACurrentSchemaAlone checks that Migrate at every start takes no lock on a
// table in use: with a transaction holding every table of idem exclusively (as a long
// migration of some other process would), a second Migrate must still return at once.
func TestMigrateLeavesACurrentSchemaAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	busy, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = busy.Rollback(b.ctx) }()
	_, err = busy.Exec(b.ctx, `LOCK TABLE idem_keys, idem_runs, idem_steps IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, idem.Migrate(ctx, b.pool), "a current schema is not touched, so nothing waits")
}

func TestMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ms := idem.Migrations()
	require.NotEmpty(t, ms)
	latest := ms[len(ms)-1].Version
	for i, m := range ms {
		require.Equal(t, i+1, m.Version)
		require.NotEmpty(t, m.Name)
		require.NotEmpty(t, m.Up)
		require.NotEmpty(t, m.Down)
	}

	t.Run("FreshDatabase", func(t *testing.T) {
		t.Parallel()
		pool := pgtemp.NewPool(t)
		v, err := idem.SchemaVersion(ctx, pool)
		require.NoError(t, err)
		require.Zero(t, v)
		require.NoError(t, idem.Migrate(ctx, pool))
		v, err = idem.SchemaVersion(ctx, pool)
		require.NoError(t, err)
		require.Equal(t, latest, v)
		var recorded []string
		rows, err := pool.Query(ctx, `SELECT version || '_' || name FROM idem_migrations ORDER BY version`)
		require.NoError(t, err)
		recorded, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Len(t, recorded, len(ms), "one row per migration")
		require.Equal(t, fmt.Sprintf("1_%s", ms[0].Name), recorded[0])
	})

	t.Run("DownToZeroAndUpAgain", func(t *testing.T) {
		t.Parallel()
		pool := pgtemp.NewPool(t)
		require.NoError(t, idem.Migrate(ctx, pool))
		before := catalog(t, pool, "public")
		_, err := pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, expires_at) VALUES ('s', 'k', now())`)
		require.NoError(t, err)

		require.NoError(t, idem.MigrateTo(ctx, pool, 0))
		v, err := idem.SchemaVersion(ctx, pool)
		require.NoError(t, err)
		require.Zero(t, v)
		require.Empty(t, catalog(t, pool, "public"), "version 0 leaves none of idem's tables")

		require.NoError(t, idem.Migrate(ctx, pool))
		require.Equal(t, before, catalog(t, pool, "public"), "up again builds the same schema")
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys`).Scan(&n))
		require.Zero(t, n)

		require.NoError(t, idem.MigrateTo(ctx, pool, latest), "already there: nothing to do")
		require.ErrorContains(t, idem.MigrateTo(ctx, pool, latest+1), "MigrateTo version must be between 0 and")
		require.ErrorContains(t, idem.MigrateTo(ctx, pool, -1), "MigrateTo version must be between 0 and")
	})

	t.Run("SchemaSQLIsWhatTheMigrationsBuild", func(t *testing.T) {
		t.Parallel()
		migrated := pgtemp.NewPool(t)
		require.NoError(t, idem.Migrate(ctx, migrated))
		applied := pgtemp.NewPool(t)
		_, err := applied.Exec(ctx, idem.SchemaSQL())
		require.NoError(t, err)
		require.Equal(t, catalog(t, migrated, "public"), catalog(t, applied, "public"))

		// A database made from schema.sql is current for Migrate, which does nothing to it.
		v, err := idem.SchemaVersion(ctx, applied)
		require.NoError(t, err)
		require.Equal(t, latest, v)
		require.NoError(t, idem.Migrate(ctx, applied))
	})

	t.Run("InASchemaOfItsOwn", func(t *testing.T) {
		t.Parallel()
		pool := pgtemp.NewPool(t)
		require.NoError(t, idem.Migrate(ctx, pool, idem.Schema("idem store")))
		require.Empty(t, catalog(t, pool, "public"))
		require.NotEmpty(t, catalog(t, pool, "idem store"))
		v, err := idem.SchemaVersion(ctx, pool)
		require.NoError(t, err)
		require.Zero(t, v, "the default schema has none")
		v, err = idem.SchemaVersion(ctx, pool, idem.Schema("idem store"))
		require.NoError(t, err)
		require.Equal(t, latest, v)
		require.NoError(t, idem.MigrateTo(ctx, pool, 0, idem.Schema("idem store")))
		require.Empty(t, catalog(t, pool, "idem store"))
	})

	t.Run("TablesWithoutVersionsAreRefused", func(t *testing.T) {
		t.Parallel()
		pool := pgtemp.NewPool(t)
		_, err := pool.Exec(ctx, `CREATE TABLE idem_keys (scope text, id text)`)
		require.NoError(t, err)
		err = idem.Migrate(ctx, pool)
		require.ErrorContains(t, err, "kept no version")
		require.ErrorContains(t, err, "drop idem_keys")
	})
}

// catalog describes the tables of idem in schema: columns with types, nullability and defaults,
// constraints and indexes, one line each, sorted; with the rows of idem_migrations. The
// partitions of the payload tables are left out: which days exist depends on the date.
func catalog(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
	|| CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
	|| coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
	|| coalesce(' collate ' || co.collname, '')
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0 AND co.collname <> 'default'
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relname LIKE 'idem\_%' AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || c.relname || '.' || con.conname || ' ' || pg_get_constraintdef(con.oid)
FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND NOT c.relispartition AND c.relname LIKE 'idem\_%'
UNION ALL
SELECT 'index ' || replace(pg_get_indexdef(i.indexrelid), quote_ident($1) || '.', '')
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND NOT c.relispartition AND c.relname LIKE 'idem\_%'
UNION ALL
SELECT 'table ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relname LIKE 'idem\_%'
ORDER BY 1`, schema)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	var versions []string
	if len(lines) > 0 {
		table := pgx.Identifier{schema, "idem_migrations"}.Sanitize()
		rows, err := pool.Query(ctx, `SELECT 'migration ' || version || ' ' || name FROM `+table+` ORDER BY version`)
		if err == nil {
			versions, err = pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
		} else {
			require.True(t, strings.Contains(err.Error(), "does not exist"), err)
		}
	}
	return append(lines, versions...)
}
