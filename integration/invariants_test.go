package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// figures are what a run reports: its size, its faults and what the checks found.
type figures struct {
	requests, final, replayed, resent int
	faults                            map[string]int
	duplicates, lost, stuck           int
}

func (f *figures) String() string {
	var faults []string
	for _, k := range []string{"kill", "conn-reset", "terminate", "lost-commit", "restart"} {
		if n, ok := f.faults[k]; ok {
			faults = append(faults, fmt.Sprintf("%s=%d", k, n))
		}
	}
	return fmt.Sprintf("requests=%d final=%d replayed=%d resent-after=%d faults[%s] duplicates=%d lost=%d stuck=%d",
		f.requests, f.final, f.replayed, f.resent, strings.Join(faults, " "), f.duplicates, f.lost, f.stuck)
}

// storedResponse is idemhttp's stored response, read straight from idem_keys.result.
type storedResponse struct {
	Status int    `json:"status"`
	Body   []byte `json:"body"`
}

// waitRecovered waits until no key is running: every payout whose process died has been resumed
// and finished by the recovery worker of a live bank.
func waitRecovered(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	eventually(t, 90*time.Second, "every running key to finish", func() (bool, error) {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_runs WHERE state = 'running'`).Scan(&n)
		return n == 0, err
	})
}

// checkInvariants counts in Postgres what the outcomes claim, and fails the test for each
// invariant that does not hold. It fills in the duplicates and stuck figures.
func checkInvariants(t testing.TB, pool *pgxpool.Pool, outs []outcome, f *figures) {
	t.Helper()
	ctx := context.Background()
	f.requests = len(outs)
	var rows pgx.Rows
	seen := map[string]bool{}
	for i := range outs {
		o := &outs[i]
		if o.final() {
			f.final++
		}
		if o.replayed {
			f.replayed++
		}
		seen[o.customer+"\x00"+o.key] = true
		if !o.final() {
			continue
		}
		scope := "customer:" + o.customer
		var result []byte
		var state string
		err := pool.QueryRow(ctx, `SELECT coalesce(r.state, 'done'), coalesce(r.output, k.result) FROM idem_keys k LEFT JOIN idem_runs r USING (scope, id) WHERE k.scope = $1 AND k.id = $2`, scope, o.key).Scan(&state, &result)
		if errors.Is(err, pgx.ErrNoRows) {
			t.Errorf("%s %s answered %d but nothing is stored under its key", o.path, o.key, o.status)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, "done", state, "key %s", o.key)
		switch o.path {
		case "/transfers":
			var stored storedResponse
			require.NoError(t, json.Unmarshal(result, &stored))
			if stored.Status != o.status || !bytes.Equal(stored.Body, o.body) {
				t.Errorf("transfer %s: the client got %d %q, the store has %d %q", o.key, o.status, o.body, stored.Status, stored.Body)
			}
			want := map[int]string{http.StatusCreated: "done", http.StatusPaymentRequired: "declined"}[o.status]
			var rows int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM bank_transfers WHERE scope = $1 AND idem_key = $2 AND status = $3`, scope, o.key, want).Scan(&rows))
			if want != "" && rows != 1 {
				t.Errorf("transfer %s answered %d but has %d %s rows", o.key, o.status, rows, want)
			}
		case "/payouts":
			got := bytes.TrimSpace(o.body)
			if o.status == http.StatusPaymentRequired {
				var p struct{ Payout json.RawMessage }
				require.NoError(t, json.Unmarshal(o.body, &p))
				got = p.Payout
			}
			if !bytes.Equal(got, result) {
				t.Errorf("payout %s: the client got %d %s, the store has %s", o.key, o.status, o.body, result)
			}
			var receipt struct{ Status string }
			require.NoError(t, json.Unmarshal(result, &receipt))
			var rows int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM bank_payouts WHERE scope = $1 AND idem_key = $2 AND status = $3`, scope, o.key, receipt.Status).Scan(&rows))
			if rows != 1 {
				t.Errorf("payout %s is %s but has %d rows in that state", o.key, receipt.Status, rows)
			}
		}
	}

	// A run that failed for good is stored as failed; under faults of the infrastructure none
	// should, since nothing in the bank's payouts fails by itself.
	failed, err := pool.Query(ctx, `SELECT id, convert_from(output, 'UTF8') FROM idem_runs WHERE state = 'failed'`)
	require.NoError(t, err)
	for failed.Next() {
		var key, result string
		require.NoError(t, failed.Scan(&key, &result))
		t.Errorf("run %s failed for good: %s", key, result)
	}
	require.NoError(t, failed.Err())

	// Effects nobody asked for: a transfer or payout under a key no client sent.
	rows, err = pool.Query(ctx, `SELECT substr(scope, 10), idem_key FROM bank_transfers UNION ALL SELECT substr(scope, 10), idem_key FROM bank_payouts`)
	require.NoError(t, err)
	for rows.Next() {
		var customer, key string
		require.NoError(t, rows.Scan(&customer, &key))
		if !seen[customer+"\x00"+key] {
			t.Errorf("an effect under key %s of %s that no client sent", key, customer)
		}
	}
	require.NoError(t, rows.Err())

	var (
		openingSum, balances, held, paidOut int64
		chargesStray, settledBare           int
		maxCharges, jobs, jobsWant, maxJobs int
	)
	err = pool.QueryRow(ctx, `SELECT
	(SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) n FROM bank_transfers GROUP BY scope, idem_key) x)
	+ (SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) n FROM bank_payouts GROUP BY scope, idem_key) x),
	(SELECT count(*) FROM idem_runs WHERE state = 'running'),
	(SELECT coalesce(sum(opening), 0) FROM bank_accounts),
	(SELECT coalesce(sum(balance), 0) FROM bank_accounts),
	(SELECT coalesce(sum(held), 0) FROM bank_accounts),
	(SELECT coalesce(sum(amount), 0) FROM bank_payouts WHERE status = 'settled'),
	(SELECT count(*) FROM provider_charges c WHERE status = 'charged'
		AND NOT EXISTS (SELECT FROM bank_payouts p WHERE p.charge_id = c.charge_id AND p.status = 'settled')),
	(SELECT count(*) FROM bank_payouts p WHERE status = 'settled'
		AND NOT EXISTS (SELECT FROM provider_charges c WHERE c.charge_id = p.charge_id AND c.status = 'charged' AND c.amount = p.amount)),
	(SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM provider_charges c JOIN bank_payouts p ON p.charge_id = c.charge_id GROUP BY p.id) x),
	(SELECT count(*) FROM river_job WHERE kind = 'bank_notify'),
	(SELECT count(*) FROM bank_transfers WHERE status = 'done') + (SELECT count(*) FROM bank_payouts WHERE status IN ('settled', 'released')),
	(SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM river_job WHERE kind = 'bank_notify' GROUP BY args->>'ref') x)`).Scan(
		&f.duplicates, &f.stuck, &openingSum, &balances, &held, &paidOut, &chargesStray, &settledBare, &maxCharges, &jobs, &jobsWant, &maxJobs)
	require.NoError(t, err)
	require.Zero(t, f.duplicates, "a key took effect more than once")
	require.Zero(t, f.stuck, "keys are still running after recovery")
	require.Equal(t, openingSum, balances+held+paidOut, "money is not conserved: %d on accounts + %d held + %d paid out", balances, held, paidOut)
	require.Zero(t, held, "money is still held after every payout finished")
	require.Zero(t, chargesStray, "provider charges without a settled payout")
	require.Zero(t, settledBare, "settled payouts without their provider charge")
	require.LessOrEqual(t, maxCharges, 1, "a payout was charged more than once")
	require.Equal(t, jobsWant, jobs, "notify jobs do not match the finished transfers and payouts")
	require.LessOrEqual(t, maxJobs, 1, "a transfer or payout queued more than one notification")
}
