package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ledger is what the database says happened, counted, never taken from responses.
type ledger struct {
	Opening, Balances, Held, PaidOut   int64 // money in, on accounts, held for payouts, gone out
	HeldForPayouts                     int64 // sum of the payouts still reserved
	Transfers, Declined                int64 // transfer rows by status
	MaxRowsPerTransferKey              int64
	Payouts                            map[string]int64 // payout rows by status
	MaxRowsPerPayoutKey                int64
	Charges                            int64 // provider charges made (status charged)
	MaxChargesPerPayout                int64
	ChargesWithoutSettled              int64 // charges no settled payout accounts for
	SettledWithoutCharge               int64
	NotifyJobs, NotifyExpected         int64
	MaxJobsPerRef                      int64
	EventsAppended, EventsPublished    int64 // transfer.completed in idem's outbox
	LedgerEvents, MaxEventsPerTransfer int64 // recorded by the ledger's inbox
	Running                            int64 // keys still running: stuck unless something works on them
}

// readLedger counts everything the invariants are about, in one snapshot.
func readLedger(ctx context.Context, pool *pgxpool.Pool) (*ledger, error) {
	l := &ledger{Payouts: map[string]int64{}}
	t, err := pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = t.Rollback(ctx) }()
	// One snapshot for every count, so a payout settling between two queries cannot make the
	// money look created or destroyed.
	if _, err := t.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY`); err != nil {
		return nil, err
	}
	err = t.QueryRow(ctx, `SELECT
	(SELECT coalesce(sum(opening), 0) FROM bank_accounts),
	(SELECT coalesce(sum(balance), 0) FROM bank_accounts),
	(SELECT coalesce(sum(held), 0) FROM bank_accounts),
	(SELECT coalesce(sum(amount), 0) FROM bank_payouts WHERE status = 'settled'),
	(SELECT coalesce(sum(amount), 0) FROM bank_payouts WHERE status = 'reserved'),
	(SELECT count(*) FILTER (WHERE status = 'done') FROM bank_transfers),
	(SELECT count(*) FILTER (WHERE status = 'declined') FROM bank_transfers),
	(SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM bank_transfers GROUP BY scope, idem_key) x),
	(SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM bank_payouts GROUP BY scope, idem_key) x),
	(SELECT count(*) FROM provider_charges WHERE status = 'charged'),
	(SELECT coalesce(max(n), 0) FROM (SELECT count(c.idem_key) n FROM bank_payouts p
		JOIN provider_charges c ON c.charge_id = p.charge_id GROUP BY p.id) x),
	(SELECT count(*) FROM provider_charges c WHERE status = 'charged'
		AND NOT EXISTS (SELECT FROM bank_payouts p WHERE p.charge_id = c.charge_id AND p.status = 'settled')),
	(SELECT count(*) FROM bank_payouts p WHERE status = 'settled'
		AND NOT EXISTS (SELECT FROM provider_charges c WHERE c.charge_id = p.charge_id AND c.status = 'charged')),
	(SELECT count(*) FROM river_job WHERE kind = 'bank_notify'),
	(SELECT count(*) FROM bank_transfers WHERE status = 'done') + (SELECT count(*) FROM bank_payouts WHERE status IN ('settled', 'released')),
	(SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM river_job WHERE kind = 'bank_notify' GROUP BY args->>'ref') x),
	(SELECT count(*) FROM idem_runs WHERE state = 'running'),
	(SELECT count(*) FROM idem_outbox WHERE topic = 'transfer.completed'),
	(SELECT count(*) FROM idem_outbox WHERE topic = 'transfer.completed' AND published_at IS NOT NULL),
	(SELECT count(*) FROM bank_ledger_events),
	(SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM bank_ledger_events GROUP BY transfer_id) x)`).Scan(
		&l.Opening, &l.Balances, &l.Held, &l.PaidOut, &l.HeldForPayouts,
		&l.Transfers, &l.Declined, &l.MaxRowsPerTransferKey, &l.MaxRowsPerPayoutKey,
		&l.Charges, &l.MaxChargesPerPayout, &l.ChargesWithoutSettled, &l.SettledWithoutCharge,
		&l.NotifyJobs, &l.NotifyExpected, &l.MaxJobsPerRef, &l.Running,
		&l.EventsAppended, &l.EventsPublished, &l.LedgerEvents, &l.MaxEventsPerTransfer)
	if err != nil {
		return nil, fmt.Errorf("error counting: %w", err)
	}
	rows, err := t.Query(ctx, `SELECT status, count(*) FROM bank_payouts GROUP BY status`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		l.Payouts[s] = n
	}
	return l, rows.Err()
}

// violations lists every invariant that does not hold. Running keys are one only when the
// caller says everything should have finished.
func (l *ledger) violations(allFinished bool) []string {
	var v []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			v = append(v, fmt.Sprintf(format, args...))
		}
	}
	check(l.Balances+l.Held+l.PaidOut == l.Opening, "money not conserved: %d on accounts + %d held + %d paid out != %d deposited",
		l.Balances, l.Held, l.PaidOut, l.Opening)
	check(l.Held == l.HeldForPayouts, "%d held on accounts, but payouts in progress hold %d", l.Held, l.HeldForPayouts)
	check(l.MaxRowsPerTransferKey <= 1, "a transfer key took effect %d times", l.MaxRowsPerTransferKey)
	check(l.MaxRowsPerPayoutKey <= 1, "a payout key reserved funds %d times", l.MaxRowsPerPayoutKey)
	check(l.MaxChargesPerPayout <= 1, "a payout has %d provider charges", l.MaxChargesPerPayout)
	check(l.ChargesWithoutSettled == 0, "%d provider charges belong to no settled payout", l.ChargesWithoutSettled)
	check(l.SettledWithoutCharge == 0, "%d settled payouts have no provider charge", l.SettledWithoutCharge)
	check(l.MaxJobsPerRef <= 1, "a transfer or payout queued %d notifications", l.MaxJobsPerRef)
	check(l.EventsAppended == l.Transfers, "%d transfer.completed events appended for %d transfers", l.EventsAppended, l.Transfers)
	check(l.MaxEventsPerTransfer <= 1, "the ledger recorded a transfer %d times", l.MaxEventsPerTransfer)
	if allFinished {
		check(l.Running == 0, "%d keys are still running", l.Running)
		check(l.Payouts["reserved"] == 0, "%d payouts are still reserved", l.Payouts["reserved"])
		check(l.NotifyJobs == l.NotifyExpected, "%d notifications queued for %d finished transfers and payouts", l.NotifyJobs, l.NotifyExpected)
	}
	return v
}
