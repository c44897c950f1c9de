package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
)

// TestSleepAcrossPostgresRestart restarts Postgres while a run sleeps: the sleep, its wake-up
// job and the run's history are all in Postgres, so the run wakes as if nothing happened.
//
// It starts a Postgres of its own, so that restarting it does not disturb the other tests. When
// pgtemp cannot restart that server (it came from TEST_DATABASE_URL or from a container), the
// restart is simulated by terminating every backend of the test's database, which is what a
// restart looks like to the application; the test logs that it did so.
func TestSleepAcrossPostgresRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := pgtemp.Start(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	url, err := srv.CreateDatabase(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.DropDatabase(context.Background(), url) })
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, migrate(ctx, pool))
	b := &testBundle{ctx: ctx, url: url, pool: pool}

	restart := func() error { return srv.Restart(ctx) }
	if !srv.Owned() || srv.Source() != "local binaries" {
		t.Logf("Postgres came from %s, which pgtemp cannot restart: the restart is simulated by terminating every backend", srv.Source())
		restart = func() error {
			_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
			return err
		}
	}

	wf := newSleeper()
	e := b.engine(t, fastConfig(wf))
	b.startRiver(t, e)
	key := idem.Key{Scope: "merchant:7", ID: "restart-1"}
	_, err = wf.Run(ctx, e, key, 2000, nil)
	require.ErrorIs(t, err, idem.ErrInFlight)
	require.NoError(t, restart())
	pool.Reset()

	eventually(t, 60*time.Second, "the run to wake and finish", func() bool {
		var state string
		err := pool.QueryRow(ctx, `SELECT state FROM idem_runs WHERE scope = $1 AND id = $2`, key.Scope, key.ID).Scan(&state)
		return err == nil && state == "done"
	})
	out, err := wf.Run(ctx, e, key, 2000, nil)
	require.NoError(t, err)
	require.Equal(t, "rested", out)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'after'`))
}
