package integration

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPostgresRestart restarts Postgres three times (IDEM_RESTARTS) while clients send transfers and payouts:
// every connection of the bank dies, Postgres is away for a moment, and the bank must come back
// without losing or doubling anything.
//
// It starts a Postgres of its own, so that restarting it does not disturb the other tests. When
// pgtemp cannot restart that server (it came from TEST_DATABASE_URL or from a container), the
// test still runs, with each restart replaced by terminating every backend of the bank's
// database, which is what a restart looks like to the bank; it logs that it did so.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, dbURL := ownServer(t)
	pool := openPool(t, dbURL)

	restart := func() error { return srv.Restart(ctx) }
	how := "Server.Restart"
	if !srv.Owned() || srv.Source() != "local binaries" {
		how = "pg_terminate_backend on every backend of the database"
		t.Logf("Postgres came from %s, which pgtemp cannot restart: each restart is simulated by %s", srv.Source(), how)
		restart = func() error {
			_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
			return err
		}
	}

	bank := startBank(t, dbURL)
	openAccounts(t, newLoadClient(bank.url()))
	// The load runs until after the last restart, so that every restart lands under load.
	l := startLoad(bank.url(), 16, 1_000_000, 8)
	restarts := 0
	for range envInt("IDEM_RESTARTS", 3) {
		// A random moment of the load.
		time.Sleep(time.Duration(300+rand.IntN(700)) * time.Millisecond)
		require.NoError(t, restart(), "restart %d", restarts+1)
		restarts++
	}
	time.Sleep(300 * time.Millisecond) // and some load on the restarted server
	outs := l.stop()
	// The test's own connections died with the server too.
	pool.Reset()

	f := &figures{faults: map[string]int{"restart": restarts}}
	f.resent, f.lost = sweep(t, bank.url(), outs)
	waitRecovered(t, pool)
	checkInvariants(t, pool, outs, f)
	t.Logf("postgres restart (%s): %s", how, f)
}
