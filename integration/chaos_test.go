package integration

import (
	"context"
	"math/rand/v2"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/faultproxy"
)

// chaosBudget bounds TestChaos's load in time.
var chaosBudget = time.Duration(envInt("IDEM_CHAOS_SECONDS", 300)) * time.Second

// TestChaos runs the bank with its Postgres connections through a fault proxy and, while many
// clients send transfers and payouts, keeps breaking things: it resets every connection through
// the proxy, terminates random backends with pg_terminate_backend, and loses COMMIT
// acknowledgements (the COMMIT lands, the bank never hears). The payment provider drops the
// connection after one charge in ten. Thirty-two clients keep the bank busy while some of them
// wait out a fault. Afterwards every key must have taken effect once, every
// client's final answer must equal the stored one, and the money must add up.
//
// The proxy is internal/faultproxy rather than toxiproxy: a lost COMMIT acknowledgement needs a
// proxy that reads the Postgres protocol to find the COMMIT and the reply that ends it, which a
// byte-level proxy cannot do; resets it does as well as toxiproxy, without a new dependency.
//
// It has a Postgres of its own: its reconnections after every reset would otherwise queue the
// other tests' connections behind them.
//
// IDEM_CHAOS_REQUESTS sets the number of requests (default 4000; 50000 for a soak), sent within
// chaosBudget (IDEM_CHAOS_SECONDS, default 300; raise it for a soak).
func TestChaos(t *testing.T) {
	t.Parallel()
	requests := envInt("IDEM_CHAOS_REQUESTS", 4000)
	ctx := context.Background()
	_, dbURL := ownServer(t)
	pool := openPool(t, dbURL)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	proxy, err := faultproxy.New(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })

	bank := startBank(t, proxy.URL(dbURL), "-provider-flaky", "0.1")
	openAccounts(t, newLoadClient(bank.url()))

	l := startLoad(bank.url(), 32, requests, 8)
	faults := map[string]int{}
	var faultsMu sync.Mutex
	done := make(chan struct{})
	var injector sync.WaitGroup
	injector.Go(func() {
		// A fault every 10-40ms, of a random kind: the point is that they land at every moment
		// of a request, which a fixed schedule would not do. Each costs a client a second or two
		// (a 503's Retry-After, a lease to expire), so a higher rate only makes the test slower.
		//
		// Each fault waits until the proxy has seen a COMMIT since the last one (the bank's or
		// River's, whatever became of its reply): the bank is connected and working again. A reset sends
		// every connection of the bank back through Postgres's startup at once; on a slow or
		// busy machine, faults at a fixed rate would land before the bank has reconnected and
		// pile up reconnections until the postmaster did nothing but fork for them. Waiting
		// for progress makes a slow machine see fewer faults per second, not a collapse.
		// A reset, the costliest fault, waits for resetEvery commits.
		const resetEvery = 25
		lastCommits, lastReset := -1, 0
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(10+rand.IntN(30)) * time.Millisecond):
			}
			c := proxy.Stats().Commits
			if c <= lastCommits {
				continue
			}
			lastCommits = c
			kind := "lost-commit"
			switch n := rand.IntN(10); {
			case n == 0:
				if c < lastReset+resetEvery {
					continue
				}
				lastReset = c
				proxy.ResetAll()
				kind = "reset"
			case n < 4:
				var terminated bool
				// The bank's backends only: the test's own pool must keep counting.
				err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM (
	SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'
	AND pid <> pg_backend_pid() AND client_port IS NOT NULL AND application_name <> 'idem-test'
	ORDER BY random() LIMIT 1) p`).Scan(&terminated)
				if err != nil || !terminated {
					continue
				}
				kind = "terminate"
			default:
				// One pending at a time: requested faults queue up in the proxy, and a queue
				// would end up losing nearly every COMMIT and starving the run.
				if st := proxy.Stats(); st.LostCommitReplies < faults["lost-commit"] {
					continue
				}
				proxy.LoseNextCommitReply()
			}
			faultsMu.Lock()
			faults[kind]++
			faultsMu.Unlock()
		}
	})
	// The load ends after its requests or after chaosBudget, whichever comes first, so that a
	// machine too slow for 4,000 requests under faults still gets its invariants checked (and
	// the package its 10 minutes) instead of a timeout's goroutine dump.
	budget := time.AfterFunc(chaosBudget, func() { l.stopped.Store(true) })
	outs := l.wait()
	budget.Stop()
	close(done)
	injector.Wait()
	if len(outs) < requests {
		t.Logf("chaos: the load stopped at its %s budget after %d of %d requests", chaosBudget, len(outs), requests)
	}
	require.GreaterOrEqual(t, len(outs), min(requests, 200), "too few requests ran for the faults to have met them")

	st := proxy.Stats()
	f := &figures{faults: map[string]int{
		"conn-reset":  st.Resets,
		"terminate":   faults["terminate"],
		"lost-commit": st.LostCommitReplies,
	}}
	f.resent, f.lost = sweep(t, bank.url(), outs)
	waitRecovered(t, pool)
	checkInvariants(t, pool, outs, f)
	require.Positive(t, st.LostCommitReplies, "no COMMIT reply was lost: the test did not test that")
	require.Positive(t, faults["terminate"], "no backend was terminated")
	require.Positive(t, st.Resets, "no connection was reset")
	t.Logf("chaos: %s (proxy saw %d commits over %d connections)", f, st.Commits, st.Connections)
}
