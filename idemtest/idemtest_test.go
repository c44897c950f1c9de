package idemtest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemtest"
)

func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }

// tableCount counts the tables named name in schema.
func tableCount(t *testing.T, pool *pgxpool.Pool, schema, name string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = $2`, schema, name).Scan(&n))
	return n
}

func TestNewPool(t *testing.T) {
	t.Parallel()

	t.Run("IdemOnly", func(t *testing.T) {
		t.Parallel()
		pool := idemtest.NewPool(t, nil)
		require.Equal(t, 1, tableCount(t, pool, "public", "idem_keys"))
		require.Zero(t, tableCount(t, pool, "public", "river_job"), "River only when asked")
	})

	t.Run("WithRiver", func(t *testing.T) {
		t.Parallel()
		pool := idemtest.NewPool(t, &idemtest.Opts{River: true})
		require.Equal(t, 1, tableCount(t, pool, "public", "idem_keys"))
		require.Equal(t, 1, tableCount(t, pool, "public", "river_job"))
	})

	t.Run("Schemas", func(t *testing.T) {
		t.Parallel()
		pool := idemtest.NewPool(t, &idemtest.Opts{Schema: "app", River: true, RiverSchema: "jobs"})
		require.Equal(t, 1, tableCount(t, pool, "app", "idem_keys"))
		require.Equal(t, 1, tableCount(t, pool, "jobs", "river_job"))
		require.Zero(t, tableCount(t, pool, "public", "idem_keys"))
	})

	t.Run("OwnDatabaseDroppedAfterTheTest", func(t *testing.T) {
		t.Parallel()
		var name string
		var dbURL string
		t.Run("inner", func(t *testing.T) {
			dbURL = idemtest.NewDB(t, nil)
			pool, err := pgxpool.New(t.Context(), dbURL)
			require.NoError(t, err)
			defer pool.Close()
			require.NoError(t, pool.QueryRow(t.Context(), `SELECT current_database()`).Scan(&name))
			require.Equal(t, 1, tableCount(t, pool, "public", "idem_keys"))
		})
		other := idemtest.NewPool(t, nil)
		var exists bool
		require.NoError(t, other.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists))
		require.False(t, exists, "the inner test's database must be dropped when it ends")
		var current string
		require.NoError(t, other.QueryRow(t.Context(), `SELECT current_database()`).Scan(&current))
		require.NotEqual(t, name, current, "every test gets a database of its own")
	})
}

// TestNoDockerModules: a module that imports idemtest builds none of Docker's client modules, so
// go mod tidy writes none of them into its go.mod (they come with
// github.com/idemkit/idem/idemtest/pgdocker, for those who import it).
func TestNoDockerModules(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	modules := strings.Fields(string(out))
	require.Contains(t, modules, "github.com/jackc/pgx/v5", "the listing works")
	for _, m := range modules {
		for _, docker := range []string{"testcontainers", "moby", "docker"} {
			require.NotContains(t, m, docker, "idemtest builds %s", m)
		}
	}
}
