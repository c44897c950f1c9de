package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/steps"
)

// declineAbove is the largest charge the provider accepts: larger ones are declined, a business
// outcome the payout stores (and releases the funds for).
const declineAbove = 100_000

// provider is a fake payment provider, served over HTTP in the bank's process. It behaves as a
// careful real one does: a charge is keyed by the caller's Idempotency-Key and recorded in its
// own table, so a repeated request returns the first charge. The demo and the tests can make it
// slow, flaky (it drops the connection after charging, so the caller never hears) or down.
type provider struct {
	pool   *pgxpool.Pool
	url    string
	srv    *http.Server
	client *providerClient

	mu       sync.Mutex
	down     bool
	flaky    float64 // probability of dropping the connection after charging
	dropNext int     // drop the next n answers to a charge, whatever flaky says
	slow     time.Duration
	webhook  string // where confirmations of pending charges go
	withhold int    // confirmations not to send, for the next n pending charges

	refused atomic.Int64 // charges answered 503 because the provider was down
	dropped atomic.Int64 // charges made whose answer was dropped
	hooks   atomic.Int64 // webhooks delivered (each confirmation twice)
}

func startProvider(pool *pgxpool.Pool, flaky float64, slow time.Duration) (*provider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("error starting the payment provider: %w", err)
	}
	p := &provider{pool: pool, url: "http://" + ln.Addr().String(), flaky: flaky, slow: slow}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", p.charge)
	mux.HandleFunc("POST /charges/{key}/resolve", p.resolve)
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	// The bank's client: no retries of its own, since the workflow's charge step retries with
	// the same key; a timeout, since a provider that hangs must not hold the run forever.
	p.client = &providerClient{base: p.url, http: &http.Client{Timeout: 10 * time.Second}}
	return p, nil
}

func (p *provider) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
}

// setDown turns the provider off (every charge gets 503, nothing is charged) or on.
func (p *provider) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
}

// dropAnswers makes the provider drop the connection after making each of the next n charges.
func (p *provider) dropAnswers(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropNext = n
}

// setWebhook tells the provider where to send confirmations.
func (p *provider) setWebhook(url string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.webhook = url
}

// withholdConfirmations makes the provider never confirm the next n pending charges.
func (p *provider) withholdConfirmations(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.withhold = n
}

type chargeRequest struct {
	Account int64 `json:"account"`
	Amount  int64 `json:"amount"`
	// Confirm asks for a pending charge, confirmed later by a webhook that carries Ref.
	Confirm bool   `json:"confirm,omitempty"`
	Ref     string `json:"ref,omitempty"`
}

// chargeResult is the charge step's output: a charge, or why there is none.
type chargeResult struct {
	ChargeID string `json:"charge_id,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Pending  bool   `json:"pending,omitempty"` // to be confirmed by webhook
}

// webhookEvent is what the provider posts to the bank when it confirms a pending charge.
type webhookEvent struct {
	EventID  string `json:"event_id"`
	ChargeID string `json:"charge_id"`
	Ref      string `json:"ref"`
}

func (p *provider) charge(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	down, slow := p.down, p.slow
	p.mu.Unlock()
	if down {
		p.refused.Add(1)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "provider unavailable", http.StatusServiceUnavailable)
		return
	}
	if slow > 0 {
		select {
		case <-time.After(slow):
		case <-r.Context().Done():
			return
		}
	}
	key, err := idemhttp.ParseKey(r.Header.Get("Idempotency-Key"))
	var req chargeRequest
	if err != nil || json.NewDecoder(r.Body).Decode(&req) != nil || req.Amount <= 0 {
		http.Error(w, "send an Idempotency-Key and {account, amount}", http.StatusBadRequest)
		return
	}
	status := "charged"
	switch {
	case req.Amount > declineAbove:
		status = "declined"
	case req.Confirm:
		status = "pending"
	}
	// The first request with a key decides; every later one reads what it decided.
	var got struct {
		status, chargeID string
		account, amount  int64
	}
	err = p.pool.QueryRow(r.Context(), `WITH ins AS (
	INSERT INTO provider_charges (idem_key, status, charge_id, account, amount)
	VALUES ($1, $2, CASE WHEN $2 IN ('charged', 'pending') THEN 'ch_' || left(md5(random()::text), 8) END, $3, $4)
	ON CONFLICT (idem_key) DO NOTHING
	RETURNING status, coalesce(charge_id, ''), account, amount
)
SELECT * FROM ins
UNION ALL
SELECT status, coalesce(charge_id, ''), coalesce(account, 0), coalesce(amount, 0) FROM provider_charges WHERE idem_key = $1 AND NOT EXISTS (SELECT FROM ins)`,
		key, status, req.Account, req.Amount).Scan(&got.status, &got.chargeID, &got.account, &got.amount)
	if err != nil {
		http.Error(w, "provider database error", http.StatusServiceUnavailable)
		return
	}
	switch {
	case got.status == "canceled":
		http.Error(w, "this key was canceled", http.StatusConflict)
		return
	case got.account != req.Account || got.amount != req.Amount:
		http.Error(w, "this key was used for another charge", http.StatusUnprocessableEntity)
		return
	}
	if p.shouldDrop() {
		p.dropped.Add(1)
		// Hijack and close: the charge is made, and the caller sees its connection die.
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	if got.status == "declined" {
		writeJSON(w, http.StatusPaymentRequired, chargeResult{Reason: fmt.Sprintf("the provider declined %d", req.Amount)})
		return
	}
	if got.status == "pending" {
		go p.confirmLater(key, got.chargeID, req.Ref)
		writeJSON(w, http.StatusAccepted, chargeResult{ChargeID: got.chargeID, Pending: true})
		return
	}
	writeJSON(w, http.StatusOK, chargeResult{ChargeID: got.chargeID})
}

func (p *provider) shouldDrop() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropNext > 0 {
		p.dropNext--
		return true
	}
	return p.flaky > 0 && rand.Float64() < p.flaky
}

// confirmLater confirms a pending charge a moment later, unless it is withheld or was canceled
// meanwhile, and tells the bank by webhook, twice, as providers that deliver at least once do.
func (p *provider) confirmLater(key, chargeID, ref string) {
	time.Sleep(200 * time.Millisecond)
	p.mu.Lock()
	url, withhold := p.webhook, p.withhold > 0
	if withhold {
		p.withhold--
	}
	p.mu.Unlock()
	if withhold || url == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tag, err := p.pool.Exec(ctx, `UPDATE provider_charges SET status = 'charged' WHERE idem_key = $1 AND status = 'pending'`, key)
	if err != nil || tag.RowsAffected() == 0 {
		return // canceled by the bank, or confirmed by an earlier request with the key
	}
	body, _ := json.Marshal(webhookEvent{EventID: "evt_" + chargeID, ChargeID: chargeID, Ref: ref})
	for delivered := 0; delivered < 2 && ctx.Err() == nil; {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := p.client.http.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				delivered++
				p.hooks.Add(1)
				continue
			}
		}
		time.Sleep(100 * time.Millisecond) // the bank is restarting, say: deliver again
	}
}

// resolve answers what became of a charge key, and cancels the key if nothing was charged under
// it (or the charge under it is still pending), so that a request still on its way, or a late
// confirmation, cannot charge later.
func (p *provider) resolve(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	var status, chargeID string
	if _, err := p.pool.Exec(r.Context(), `UPDATE provider_charges SET status = 'canceled' WHERE idem_key = $1 AND status = 'pending'`, key); err != nil {
		http.Error(w, "provider database error", http.StatusServiceUnavailable)
		return
	}
	err := p.pool.QueryRow(r.Context(), `WITH ins AS (
	INSERT INTO provider_charges (idem_key, status) VALUES ($1, 'canceled') ON CONFLICT (idem_key) DO NOTHING RETURNING status, ''
)
SELECT * FROM ins
UNION ALL
SELECT status, coalesce(charge_id, '') FROM provider_charges WHERE idem_key = $1 AND NOT EXISTS (SELECT FROM ins)`, key).Scan(&status, &chargeID)
	if err != nil {
		http.Error(w, "provider database error", http.StatusServiceUnavailable)
		return
	}
	if status == "charged" {
		writeJSON(w, http.StatusOK, chargeResult{ChargeID: chargeID})
		return
	}
	writeJSON(w, http.StatusOK, chargeResult{Reason: "the provider could not be reached; nothing was charged"})
}

// providerClient is how the bank talks to the provider.
type providerClient struct {
	base string
	http *http.Client
}

// errDeclined marks a charge the provider refused for good.
var errDeclined = errors.New("declined")

func (c *providerClient) charge(ctx context.Context, key string, account, amount int64, confirm bool, ref string) (chargeResult, error) {
	req := chargeRequest{Account: account, Amount: amount, Confirm: confirm}
	if confirm {
		req.Ref = ref
	}
	return c.post(ctx, key, req)
}

func (c *providerClient) post(ctx context.Context, key string, charge chargeRequest) (chargeResult, error) {
	body, _ := json.Marshal(charge)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/charges", bytes.NewReader(body))
	if err != nil {
		return chargeResult{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	var res chargeResult
	status, err := c.do(req, &res)
	switch {
	case err != nil:
		return res, err // retried by the step, with the same key
	case status == http.StatusOK, status == http.StatusAccepted:
		return res, nil
	case status == http.StatusPaymentRequired:
		return res, nil // a decline is an answer, stored like a charge
	case status >= 500 || status == http.StatusTooManyRequests:
		return res, fmt.Errorf("provider answered %d", status)
	default:
		return res, steps.Permanent(fmt.Errorf("provider answered %d: %w", status, errDeclined))
	}
}

func (c *providerClient) resolve(ctx context.Context, key string) (chargeResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/charges/"+key+"/resolve", nil)
	if err != nil {
		return chargeResult{}, err
	}
	var res chargeResult
	status, err := c.do(req, &res)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("provider answered %d", status)
	}
	return res, err
}

func (c *providerClient) do(req *http.Request, v any) (int, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusPaymentRequired {
		if err := json.Unmarshal(data, v); err != nil {
			return 0, fmt.Errorf("provider answered %d with a body that is not a charge: %w", resp.StatusCode, err)
		}
	}
	return resp.StatusCode, nil
}
