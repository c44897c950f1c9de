package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/workflow"
)

// demo plays the tour: every request is one narrated line, and every claim is checked against
// the database at the end.
func demo(ctx context.Context, a *app, out io.Writer) error {
	start := time.Now()
	// The narration comes from several goroutines (a request in flight while the demo waits).
	out = &lockedWriter{w: out}
	d := newDemoClient(a.url, out)
	var failed []string
	expect := func(ok bool, format string, args ...any) {
		if !ok {
			msg := fmt.Sprintf(format, args...)
			failed = append(failed, msg)
			fmt.Fprintf(out, "   !! %s\n", msg)
		}
	}

	d.section("open two accounts")
	alice := d.openAccount(ctx, "alice", 1000)
	bob := d.openAccount(ctx, "bob", 1000)
	expect(alice > 0 && bob > 0, "accounts were not opened")

	d.section("a transfer, then the same request again (the client timed out, say)")
	k1 := newKey("tr")
	first := d.transfer(ctx, d.client, k1, alice, bob, 100, "alice pays bob 100")
	again := d.transfer(ctx, d.client, k1, alice, bob, 100, "the same request, retried")
	expect(first.status == 201 && !first.replayed, "the first transfer should run (got %d)", first.status)
	expect(again.replayed && bytes.Equal(first.body, again.body), "the retry should replay the first answer")

	d.section("20 concurrent duplicates of one request")
	k2 := newKey("tr")
	var wg sync.WaitGroup
	results := make([]response, 20)
	for i := range results {
		wg.Go(func() {
			results[i] = d.send(ctx, d.client, "POST", "/transfers", "alice", k2, transferRequest{From: alice, To: bob, Amount: 5})
		})
	}
	wg.Wait()
	fresh, replays, same := 0, 0, true
	for _, r := range results {
		if r.replayed {
			replays++
		} else if r.status == 201 {
			fresh++
		}
		same = same && bytes.Equal(r.body, results[0].body)
	}
	d.line("POST", "/transfers", k2, results[0].status, fmt.Sprintf("x20 at once: %d ran, %d replayed; %d 409s retried", fresh, replays, d.conflicts.Load()), false)
	expect(fresh == 1 && replays == 19 && same, "20 duplicates should make 1 execution and 19 identical replays")

	d.section("the same key with a different amount, and an overdraft")
	mismatch := d.transfer(ctx, d.client, k1, alice, bob, 999, "first transfer's key, amount 999")
	expect(mismatch.status == 422, "a reused key should get 422 (got %d)", mismatch.status)
	k3 := newKey("tr")
	declined := d.transfer(ctx, d.client, k3, alice, bob, 1_000_000, "alice sends 1,000,000")
	declinedAgain := d.transfer(ctx, d.client, k3, alice, bob, 1_000_000, "retried: still declined")
	expect(declined.status == 402 && declinedAgain.replayed && bytes.Equal(declined.body, declinedAgain.body), "a decline should be stored and replayed")

	d.section("bob asks to move money out of alice's account")
	kb := newKey("tr")
	stolen := d.send(ctx, d.client, "POST", "/transfers", "bob", kb, transferRequest{From: alice, To: bob, Amount: 100})
	d.line("POST", "/transfers", kb, stolen.status, "bob: alice pays bob 100", stolen.replayed)
	expect(stolen.status == 404 && !stolen.replayed, "a transfer out of someone else's account should get 404 (got %d)", stolen.status)

	d.section("the network drops the response; idemhttp.Transport retries with the same key")
	d.net.dropNext.Store(1)
	lost := d.transfer(ctx, d.client, newKey("tr"), bob, alice, 10, "bob pays alice 10")
	expect(lost.status == 201 && lost.replayed, "the retry after a lost response should be a replay (got %d)", lost.status)

	d.section("a payout: reserve, charge the provider, settle, notify")
	p1 := d.payout(ctx, d.client, newKey("po"), bob, 200, "bob withdraws 200")
	expect(p1.status == 200, "the payout should settle (got %d)", p1.status)

	d.section("a payout whose process dies after the provider charged, before settle")
	a.crash.arm("payout:after-charge", func(ctx context.Context, point string) error {
		return workflow.StopRun(ctx, fmt.Errorf("simulated crash at %s", point))
	})
	kp := newKey("po")
	dead := d.payout(ctx, d.once, kp, bob, 50, "bob withdraws 50; process dies")
	expect(dead.status == 503, "the interrupted payout should answer 503 (got %d)", dead.status)
	var attempts int
	err := d.wait(ctx, "the recovery worker to resume it", 30*time.Second, func() (bool, error) {
		var state string
		err := a.pool.QueryRow(ctx, `SELECT state, attempts FROM idem_runs WHERE scope = 'customer:bob' AND id = $1`, kp).Scan(&state, &attempts)
		return state == "done", err
	})
	expect(err == nil, "the payout was not resumed: %v", err)
	var charges int
	_ = a.pool.QueryRow(ctx, `SELECT count(*) FROM provider_charges c JOIN bank_payouts p ON p.charge_id = c.charge_id WHERE p.idem_key = $1`, kp).Scan(&charges)
	fmt.Fprintf(out, "   resumed by the recovery worker (attempt %d): the charge step replayed, %d provider charge\n", attempts, charges)
	resumed := d.payout(ctx, d.client, kp, bob, 50, "retried: the resumed payout")
	expect(attempts == 2 && charges == 1 && resumed.status == 200 && resumed.replayed, "the resumed payout should be done once, with one charge")

	d.section("the provider drops its answer after charging, then is down for a while")
	a.provider.dropAnswers(1)
	kf := newKey("po")
	flaky := d.payout(ctx, d.client, kf, alice, 30, "alice withdraws 30; 1st answer lost")
	_ = a.pool.QueryRow(ctx, `SELECT count(*) FROM provider_charges c JOIN bank_payouts p ON p.charge_id = c.charge_id WHERE p.idem_key = $1`, kf).Scan(&charges)
	fmt.Fprintf(out, "   the charge step retried with the same key: %d provider charge\n", charges)
	expect(flaky.status == 200 && charges == 1, "a dropped answer should not charge twice")

	a.provider.setDown(true)
	refusedBefore := a.provider.refused.Load()
	done := make(chan response, 1)
	kd := newKey("po")
	go func() {
		done <- d.send(ctx, d.client, "POST", "/payouts", "alice", kd, map[string]int64{"account": alice, "amount": 20})
	}()
	err = d.wait(ctx, "the provider to refuse the charge twice", 30*time.Second, func() (bool, error) {
		return a.provider.refused.Load()-refusedBefore >= 2, nil
	})
	expect(err == nil, "the provider was never asked: %v", err)
	a.provider.setDown(false)
	fmt.Fprintf(out, "   the provider is up again\n")
	up := <-done
	var rc payoutReceipt
	_ = json.Unmarshal(up.body, &rc)
	d.line("POST", "/payouts", kd, up.status, "alice withdraws 20 (sent while down) → "+rc.ChargeID, up.replayed)
	expect(up.status == 200, "the payout should settle once the provider is back (got %d)", up.status)

	d.section("a payout the provider confirms later, by a webhook it delivers twice")
	kc := newKey("po")
	hooksBefore := a.provider.hooks.Load()
	waiting := d.payoutWith(ctx, d.once, kc, alice, 40, true, "alice withdraws 40; confirmed by webhook")
	expect(waiting.status == 409, "the payout should await the confirmation (got %d)", waiting.status)
	fmt.Fprintf(out, "   the payout awaits the webhook holding nothing: no lease, no goroutine, no worker\n")
	err = d.wait(ctx, "the webhook to wake the payout", 30*time.Second, func() (bool, error) {
		var state string
		err := a.pool.QueryRow(ctx, `SELECT state FROM idem_runs WHERE scope = 'customer:alice' AND id = $1`, kc).Scan(&state)
		return state == "done", err
	})
	expect(err == nil, "the confirmed payout did not finish: %v", err)
	err = d.wait(ctx, "the second delivery", 30*time.Second, func() (bool, error) { return a.provider.hooks.Load()-hooksBefore >= 2, nil })
	expect(err == nil, "the provider did not deliver its webhook twice: %v", err)
	var webhooks, signals int
	_ = a.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM bank_webhooks WHERE ref = 'customer:alice/' || $1::text),
	(SELECT count(*) FROM idem_signals WHERE scope = 'customer:alice' AND id = $1)`, kc).Scan(&webhooks, &signals)
	fmt.Fprintf(out, "   the provider delivered its webhook %d times: %d recorded, %d signal (deduplicated by its event id)\n",
		a.provider.hooks.Load()-hooksBefore, webhooks, signals)
	confirmed := d.payoutWith(ctx, d.client, kc, alice, 40, true, "retried: the confirmed payout")
	expect(confirmed.status == 200 && confirmed.replayed && webhooks == 1 && signals == 1, "the confirmed payout should settle once, woken by one signal")

	d.section("a payout whose confirmation never comes: the timeout releases the hold")
	a.provider.withholdConfirmations(1)
	kt := newKey("po")
	never := d.payoutWith(ctx, d.once, kt, alice, 25, true, "alice withdraws 25; no webhook will come")
	expect(never.status == 409, "the payout should await the confirmation (got %d)", never.status)
	err = d.wait(ctx, fmt.Sprintf("the %s timeout", confirmTimeout), 30*time.Second, func() (bool, error) {
		var state string
		err := a.pool.QueryRow(ctx, `SELECT state FROM idem_runs WHERE scope = 'customer:alice' AND id = $1`, kt).Scan(&state)
		return state == "done", err
	})
	expect(err == nil, "the unconfirmed payout did not finish: %v", err)
	released := d.payoutWith(ctx, d.client, kt, alice, 25, true, "retried: funds released, charge canceled")
	var canceled int
	_ = a.pool.QueryRow(ctx, `SELECT count(*) FROM provider_charges WHERE status = 'canceled' AND charge_id IS NOT NULL`).Scan(&canceled)
	expect(released.status == 402 && released.replayed && canceled == 1, "the unconfirmed payout should be released, its pending charge canceled")

	d.section("checked in Postgres and in JetStream")
	var l *ledger
	err = d.wait(ctx, "notifications to be delivered", 30*time.Second, func() (bool, error) {
		var delivered int64
		var err error
		if l, err = readLedger(ctx, a.pool); err != nil {
			return false, err
		}
		err = a.pool.QueryRow(ctx, `SELECT count(*) FROM bank_notifications`).Scan(&delivered)
		return l.Running == 0 && delivered == l.NotifyExpected, err
	})
	if l == nil {
		return fmt.Errorf("error reading the ledger: %w", err)
	}
	var stored uint64
	evErr := d.wait(ctx, "the ledger service to record every transfer.completed", 30*time.Second, func() (bool, error) {
		var err error
		if l, err = readLedger(ctx, a.pool); err != nil {
			return false, err
		}
		if stored, err = a.events.streamCount(ctx); err != nil {
			return false, err
		}
		return l.EventsPublished == l.Transfers && l.LedgerEvents == l.Transfers && stored == uint64(l.Transfers), nil
	})
	expect(evErr == nil, "transfer.completed: %d transfers, %d published, %d in the stream, %d recorded by the ledger",
		l.Transfers, l.EventsPublished, stored, l.LedgerEvents)
	d.summary(l)
	fmt.Fprintf(out, "  %-14s %d published with their transfers, %d in the stream, %d in the ledger, once each  %s\n", "events",
		l.EventsPublished, stored, l.LedgerEvents, mark(evErr == nil && l.MaxEventsPerTransfer <= 1))
	failed = append(failed, l.violations(err == nil)...)
	if len(failed) > 0 {
		return fmt.Errorf("%d claims did not hold:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	fmt.Fprintf(out, "\nevery key took effect once and every retry got the same answer (%.1fs)\n", time.Since(start).Seconds())
	return nil
}

// response is one request's final answer, as the client got it.
type response struct {
	status   int
	replayed bool
	body     []byte
}

// demoClient sends the demo's requests and narrates them.
type demoClient struct {
	base      string
	out       io.Writer
	net       *lossyNet
	client    *http.Client // retries as idemhttp.Transport does
	once      *http.Client // one attempt, to show an answer the retrying client would hide
	conflicts atomic.Int64
	mu        sync.Mutex
	owners    map[int64]string // account -> customer, as opened
}

func newDemoClient(base string, out io.Writer) *demoClient {
	d := &demoClient{base: base, out: out, owners: map[int64]string{}}
	d.net = &lossyNet{base: http.DefaultTransport, out: out, conflicts: &d.conflicts}
	d.client = &http.Client{Transport: &idemhttp.Transport{Base: d.net, MinBackoff: 20 * time.Millisecond, MaxAttempts: 10}}
	d.once = &http.Client{Transport: &idemhttp.Transport{Base: d.net, MaxAttempts: 1}}
	fmt.Fprintf(out, "\n%-15s %-13s %-4s %-9s %s\n", "request", "key", "code", "", "what happened")
	return d
}

func (d *demoClient) section(title string) {
	fmt.Fprintf(d.out, "\n── %s\n", title)
}

func (d *demoClient) line(method, path, key string, status int, note string, replayed bool) {
	how := "ran"
	switch {
	case replayed:
		how = "replayed"
	case status == 0:
		how = "no answer"
	case status >= 500:
		how = "failed"
	case status == http.StatusConflict:
		how = "in flight"
	case status >= 400 && status != http.StatusPaymentRequired:
		how = "refused"
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.out, "%-15s %-13s %3d  %-9s %s\n", method+" "+path, key, status, how, note)
}

func (d *demoClient) send(ctx context.Context, c *http.Client, method, path, customer, key string, body any) response {
	data, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, method, d.base+path, bytes.NewReader(data))
	if err != nil {
		return response{}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Customer", customer)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Fprintf(d.out, "   request failed: %v\n", err)
		return response{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, replayed: resp.Header.Get(idemhttp.DefaultReplayedHeader) == "true", body: b}
}

func (d *demoClient) openAccount(ctx context.Context, owner string, opening int64) int64 {
	key := newKey("ac")
	r := d.send(ctx, d.client, "POST", "/accounts", owner, key, map[string]any{"owner": owner, "opening": opening})
	var acct account
	_ = json.Unmarshal(r.body, &acct)
	d.line("POST", "/accounts", key, r.status, fmt.Sprintf("%s opens account %d with %d", owner, acct.ID, opening), r.replayed)
	d.mu.Lock()
	d.owners[acct.ID] = owner
	d.mu.Unlock()
	return acct.ID
}

func (d *demoClient) transfer(ctx context.Context, c *http.Client, key string, from, to, amount int64, note string) response {
	d.mu.Lock()
	customer := d.owners[from] // the payer sends it
	d.mu.Unlock()
	r := d.send(ctx, c, "POST", "/transfers", customer, key, transferRequest{From: from, To: to, Amount: amount})
	var rc transferReceipt
	if json.Unmarshal(r.body, &rc) == nil && r.status == 201 {
		note += fmt.Sprintf(" → #%d, payer has %d", rc.ID, rc.FromBalance)
	}
	d.line("POST", "/transfers", key, r.status, note, r.replayed)
	return r
}

func (d *demoClient) payout(ctx context.Context, c *http.Client, key string, account, amount int64, note string) response {
	return d.payoutWith(ctx, c, key, account, amount, false, note)
}

// payoutWith sends a payout; with confirm, the provider confirms its charge later, by webhook.
func (d *demoClient) payoutWith(ctx context.Context, c *http.Client, key string, account, amount int64, confirm bool, note string) response {
	d.mu.Lock()
	customer := d.owners[account]
	d.mu.Unlock()
	body := map[string]any{"account": account, "amount": amount}
	if confirm {
		body["confirm"] = true
	}
	r := d.send(ctx, c, "POST", "/payouts", customer, key, body)
	var rc payoutReceipt
	if json.Unmarshal(r.body, &rc) == nil && rc.ChargeID != "" {
		note += " → " + rc.ChargeID
	}
	d.line("POST", "/payouts", key, r.status, note, r.replayed)
	return r
}

// wait polls cond until it holds, showing a dot every half second, for at most limit.
func (d *demoClient) wait(ctx context.Context, what string, limit time.Duration, cond func() (bool, error)) error {
	fmt.Fprintf(d.out, "   waiting for %s ", what)
	defer fmt.Fprintln(d.out)
	deadline := time.Now().Add(limit)
	lastDot := time.Now()
	for {
		ok, err := cond()
		if ok {
			fmt.Fprint(d.out, " done")
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %s (last error: %v)", limit, err)
		}
		if time.Since(lastDot) >= 500*time.Millisecond {
			fmt.Fprint(d.out, ".")
			lastDot = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// mark is a check's verdict in the summary.
func mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAILED"
}

func (d *demoClient) summary(l *ledger) {
	fmt.Fprintf(d.out, "  %-14s %d deposited = %d on accounts + %d held + %d paid out  %s\n", "money",
		l.Opening, l.Balances, l.Held, l.PaidOut, mark(l.Balances+l.Held+l.PaidOut == l.Opening))
	fmt.Fprintf(d.out, "  %-14s %d done, %d declined; executions per key: at most %d  %s\n", "transfers",
		l.Transfers, l.Declined, l.MaxRowsPerTransferKey, mark(l.MaxRowsPerTransferKey <= 1))
	fmt.Fprintf(d.out, "  %-14s %d settled; provider charges per payout: at most %d; stray charges: %d  %s\n", "payouts",
		l.Payouts["settled"], l.MaxChargesPerPayout, l.ChargesWithoutSettled, mark(l.MaxChargesPerPayout <= 1 && l.ChargesWithoutSettled == 0 && l.SettledWithoutCharge == 0))
	fmt.Fprintf(d.out, "  %-14s %d queued for %d transfers and payouts, at most %d each  %s\n", "notifications",
		l.NotifyJobs, l.NotifyExpected, l.MaxJobsPerRef, mark(l.NotifyJobs == l.NotifyExpected && l.MaxJobsPerRef <= 1))
	fmt.Fprintf(d.out, "  %-14s %d  %s\n", "keys stuck", l.Running, mark(l.Running == 0))
}

// lossyNet is the demo's network: it can lose the response to a request the server has
// answered, and it counts the 409s that idemhttp.Transport retries.
type lossyNet struct {
	base      http.RoundTripper
	out       io.Writer
	dropNext  atomic.Int64
	conflicts *atomic.Int64
}

func (n *lossyNet) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := n.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusConflict {
		n.conflicts.Add(1)
	}
	if n.dropNext.Load() > 0 && n.dropNext.Add(-1) >= 0 {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		fmt.Fprintf(n.out, "   (the server answered %d, and the network lost it)\n", resp.StatusCode)
		return nil, errors.New("connection reset by peer (simulated)")
	}
	return resp, nil
}

// newKey returns a short random key, readable in the narration.
func newKey(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// lockedWriter serializes writes from the demo's goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
