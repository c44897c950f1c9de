package integration

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtemp"
)

// TestSmoke is the short end-to-end run, against whatever Postgres pgtemp found: a
// testcontainers Postgres when a Docker engine answers, else TEST_DATABASE_URL or the local
// binaries. It never skips; it logs which source it used, so that a run without Docker says
// plainly that the testcontainers path was not exercised rather than passing in silence.
func TestSmoke(t *testing.T) {
	t.Parallel()
	srv := pgtemp.Shared(t)
	if srv.Source() == "testcontainers" {
		t.Log("smoke test against a testcontainers Postgres")
	} else {
		t.Logf("smoke test against %s: no Docker engine answered (or TEST_DATABASE_URL was set), so the testcontainers path was not exercised in this run", srv.Source())
	}
	dbURL := pgtemp.NewDB(t)
	pool := openPool(t, dbURL)
	bank := startBank(t, dbURL)
	openAccounts(t, newLoadClient(bank.url()))
	outs := startLoad(bank.url(), 8, 300, 5).wait()

	f := &figures{faults: map[string]int{}}
	f.resent, f.lost = sweep(t, bank.url(), outs)
	waitRecovered(t, pool)
	checkInvariants(t, pool, outs, f)
	require.Equal(t, 300, f.requests)
	t.Logf("smoke (%s): %s", srv.Source(), f)
}
