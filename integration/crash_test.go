package integration

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtemp"
)

// TestCrashUnderLoad SIGKILLs the bank at random moments while clients send transfers and
// payouts, restarts it at once on the same address, and lets the clients' retries and the
// recovery worker finish everything. Then every key must have taken effect once, with the
// answer the client got byte-equal to the stored one.
//
// IDEM_CRASH_KILLS sets the number of kills (default 20).
func TestCrashUnderLoad(t *testing.T) {
	t.Parallel()
	kills := envInt("IDEM_CRASH_KILLS", 20)
	dbURL := pgtemp.NewDB(t)
	pool := openPool(t, dbURL)
	bank := startBank(t, dbURL, "-provider-flaky", "0.05")
	openAccounts(t, newLoadClient(bank.url()))

	// The load is bounded by the kills, not by a count: it runs until the last restart.
	l := startLoad(bank.url(), 8, 1_000_000, 8)
	for range kills {
		// A random moment: somewhere within the next 50-600ms of serving.
		time.Sleep(time.Duration(50+rand.IntN(550)) * time.Millisecond)
		bank.kill()
		bank.start()
	}
	// A little more load on the last process, so that recovery happens under load too.
	time.Sleep(300 * time.Millisecond)
	outs := l.stop()

	f := &figures{faults: map[string]int{"kill": bank.kills}}
	f.resent, f.lost = sweep(t, bank.url(), outs)
	waitRecovered(t, pool)
	checkInvariants(t, pool, outs, f)
	require.GreaterOrEqual(t, bank.kills, kills)
	t.Logf("crash under load: %s", f)
}

// TestCrashPoints kills the bank at each step boundary of a payout (and inside a transfer's
// transaction), one point per subtest: the process SIGKILLs itself on reaching the point, a new
// process starts, and the client's retry and the recovery worker must finish the operation
// exactly once.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	points := []string{
		"transfer:before-commit",
		"payout:after-reserve",
		"payout:in-charge",
		"payout:after-charge",
		"payout:after-settle",
		"payout:after-notify",
	}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			dbURL := pgtemp.NewDB(t)
			pool := openPool(t, dbURL)
			bank := startBank(t, dbURL)
			c := newLoadClient(bank.url())
			openAccounts(t, c)
			bank.kill()
			bank.start("-die-at", point)

			o := op{customer: "c1", key: uuid.NewString()}
			if point == "transfer:before-commit" {
				o.path = "/transfers"
				o.body, _ = json.Marshal(map[string]int64{"from": 1, "to": 2, "amount": 700})
			} else {
				o.path = "/payouts"
				o.body, _ = json.Marshal(map[string]int64{"account": 1, "amount": 700})
			}
			answered := make(chan outcome, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				answered <- c.do(ctx, o)
			}()
			require.True(t, bank.waitDeath(30*time.Second), "the bank should have died of SIGKILL at %s", point)
			bank.start()
			var out outcome
			select {
			case out = <-answered:
			case <-time.After(2 * time.Minute):
				t.Fatal("the client got no answer after the restart")
			}
			require.NoError(t, out.err)
			want := http.StatusOK
			if o.path == "/transfers" {
				want = http.StatusCreated
			}
			require.Equal(t, want, out.status, string(out.body))

			waitRecovered(t, pool)
			f := &figures{faults: map[string]int{"kill": 1}}
			checkInvariants(t, pool, []outcome{out}, f)
			if o.path == "/payouts" {
				var charges, attempts int
				require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM provider_charges WHERE status = 'charged'`).Scan(&charges))
				require.Equal(t, 1, charges, "the payout must be charged exactly once")
				require.NoError(t, pool.QueryRow(context.Background(), `SELECT attempts FROM idem_runs WHERE id = $1`, o.key).Scan(&attempts))
				if point == "payout:after-reserve" {
					// The run's row commits with its first step's transaction, which stays open
					// until the next step: killed here, the run left nothing, and the retry
					// started it afresh.
					require.Equal(t, 1, attempts, "nothing of the dead process's run committed")
				} else {
					require.GreaterOrEqual(t, attempts, 2, "the run must have been taken over after the death")
				}
			}
			t.Logf("crash at %s: answered %d (replayed=%v) %s", point, out.status, out.replayed, f)
		})
	}
}
