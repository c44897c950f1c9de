package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemui"
	"github.com/idemkit/idem/workflow"
)

// problemBase starts the type URI of the bank's own problems (RFC 9457).
const problemBase = "https://bank.example/problems/"

// customerOf is the caller's identity. A real bank authenticates; the example trusts a header.
func customerOf(r *http.Request) string { return r.Header.Get("X-Customer") }

// scopeOf is the scope of the caller's keys: two customers never see each other's keys.
func scopeOf(r *http.Request) string {
	if c := customerOf(r); c != "" {
		return "customer:" + c
	}
	return ""
}

// Who may do what: a customer opens accounts in their own name, sees only their own accounts,
// and moves money (a transfer's "from", a payout) only out of their own accounts; money may go
// to anyone's account. An account that is not the caller's is answered as one that does not
// exist, 404 no-such-account, so that customers cannot probe each other's accounts.
//
// That refusal is not stored under the key: nothing ran, and a key that named the wrong account
// by mistake stays free for the request that was meant. (Storing it would be sound too, since
// the scope is part of the key and an account's owner never changes here; not storing keeps
// the key's one stored answer the one that did something.)

// Answers a retry gets again. A stored answer is never a 5xx: generic HTTP clients retry every
// 5xx (go-retryablehttp's default policy does), and would keep asking instead of showing the
// caller the final answer.
//
//	transfer done               201, stored
//	transfer declined           402 insufficient-funds, stored
//	payout settled              200, stored by its workflow
//	payout released/declined    402 payout-released, payout-declined, stored
//	payout failed for good      422 payout-failed, stored: funds stay held for an operator
//	account not the caller's    404 no-such-account, not stored
//	database error              503 database-error + Retry-After, not stored
//	payout interrupted          503 payout-interrupted + Retry-After, resumed in the background

// noSuchAccount answers for an account that does not exist or is not the caller's.
func noSuchAccount(w http.ResponseWriter, id int64) {
	writeProblem(w, http.StatusNotFound, "no-such-account", "No such account", fmt.Sprintf("You have no account %d.", id), nil)
}

// transferRoute requires a key on transfers and keeps refusals that did nothing out of the
// store (see above); 4xx answers of a transfer that ran, such as a decline, are stored.
var transferRoute = &idemhttp.RouteConfig{
	Key:   idemhttp.KeyRequired,
	Store: func(status int) bool { return status != http.StatusNotFound },
}

func (a *app) routes() (http.Handler, error) {
	mw, err := idemhttp.Middleware(a.pool, &idemhttp.Config{Scope: scopeOf, Logger: a.log})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /accounts", mw(http.HandlerFunc(a.createAccount)))
	mux.HandleFunc("GET /accounts/{id}", a.getAccount)
	mux.Handle("POST /transfers", mw(idemhttp.Route(transferRoute, http.HandlerFunc(a.transfer))))
	// Payouts are a workflow, which keeps its own key: the middleware would hold a transaction
	// open across the call to the provider.
	mux.HandleFunc("POST /payouts", a.createPayout)
	mux.HandleFunc("POST /webhooks/provider", a.providerWebhook)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	// The web view of the bank's payouts and keys, read-only. A real service mounts it behind its
	// operators' own authentication.
	ops, err := idemui.NewHandler(a.engine, &idemui.Options{Prefix: opsPrefix, Logger: a.log})
	if err != nil {
		return nil, err
	}
	mux.Handle(opsPrefix+"/", ops)
	return mux, nil
}

// opsPrefix is where the bank mounts idemui.
const opsPrefix = "/ops/idem"

type account struct {
	ID      int64  `json:"id"`
	Owner   string `json:"owner"`
	Balance int64  `json:"balance"`
	Held    int64  `json:"held"`
}

// createAccount opens an account in the caller's name with its opening deposit: the only way
// money enters the bank. With an Idempotency-Key it runs in the middleware's transaction, so a
// retry does not open a second account.
func (a *app) createAccount(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Owner   string `json:"owner"`
		Opening int64  `json:"opening"`
	}
	customer := customerOf(r)
	if customer == "" {
		writeProblem(w, http.StatusUnauthorized, "no-customer", "Customer required", "Send X-Customer: the customer the account is for.", nil)
		return
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Opening < 0 || (req.Owner != "" && req.Owner != customer) {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "Invalid request", `Send {"opening": amount >= 0}; "owner", if sent, must be the X-Customer.`, nil)
		return
	}
	req.Owner = customer
	var db interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	} = a.pool
	if t, ok := idemhttp.Tx(r.Context()); ok {
		db = t
	}
	acct := account{Owner: req.Owner, Balance: req.Opening}
	err := db.QueryRow(r.Context(), `INSERT INTO bank_accounts (owner, opening, balance) VALUES ($1, $2, $2) RETURNING id`,
		req.Owner, req.Opening).Scan(&acct.ID)
	if err != nil {
		unavailable(w, "The account could not be opened; retry.")
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/accounts/%d", acct.ID))
	writeJSON(w, http.StatusCreated, acct)
}

// getAccount shows one of the caller's accounts.
func (a *app) getAccount(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeProblem(w, http.StatusNotFound, "no-such-account", "No such account", "Account ids are numbers.", nil)
		return
	}
	acct := account{ID: id}
	err = a.pool.QueryRow(r.Context(), `SELECT owner, balance, held FROM bank_accounts WHERE id = $1 AND owner = $2`, id, customerOf(r)).Scan(&acct.Owner, &acct.Balance, &acct.Held)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		noSuchAccount(w, id)
	case err != nil:
		unavailable(w, "Retry.")
	default:
		writeJSON(w, http.StatusOK, acct)
	}
}

type transferRequest struct {
	From   int64 `json:"from"`
	To     int64 `json:"to"`
	Amount int64 `json:"amount"`
}

type transferReceipt struct {
	ID          int64  `json:"id"`
	From        int64  `json:"from"`
	To          int64  `json:"to"`
	Amount      int64  `json:"amount"`
	FromBalance int64  `json:"from_balance"`
	Status      string `json:"status"`
}

// transfer moves money between two accounts in the middleware's transaction, which also holds
// the idempotency key and will hold the stored response: the balances, the transfer's row, its
// notify job and the answer commit together or not at all. A declined transfer is a 402 that is
// stored too, so a retry is declined the same way even if the money has arrived since.
func (a *app) transfer(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	t, ok := idemhttp.Tx(ctx)
	if !ok { // the route requires a key, so the middleware always gives a transaction
		writeProblem(w, http.StatusBadRequest, "invalid-request", "Idempotency-Key required", "Send an Idempotency-Key.", nil)
		return
	}
	var req transferRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 || req.From == req.To {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "Invalid transfer", `Send {"from": id, "to": another id, "amount": > 0}.`, nil)
		return
	}
	key, _ := idemhttp.ParseKey(r.Header.Get(idemhttp.DefaultKeyHeader)) // parsed already by the middleware

	// Both rows are locked in id order, so two transfers in opposite directions queue instead
	// of deadlocking.
	rows, err := t.Query(ctx, `SELECT id, owner, balance FROM bank_accounts WHERE id IN ($1, $2) ORDER BY id FOR UPDATE`, req.From, req.To)
	if err != nil {
		dbError(w)
		return
	}
	balances, owners := map[int64]int64{}, map[int64]string{}
	for rows.Next() {
		var id, bal int64
		var owner string
		if err := rows.Scan(&id, &owner, &bal); err != nil {
			rows.Close()
			dbError(w)
			return
		}
		balances[id], owners[id] = bal, owner
	}
	if rows.Close(); rows.Err() != nil {
		dbError(w)
		return
	}
	switch {
	case owners[req.From] != customerOf(r):
		noSuchAccount(w, req.From) // the caller's money only; not stored (transferRoute)
		return
	case owners[req.To] == "":
		writeProblem(w, http.StatusNotFound, "no-such-account", "No such account", fmt.Sprintf("There is no account %d to pay into.", req.To), nil)
		return
	}

	scope := scopeOf(r)
	if balances[req.From] < req.Amount {
		if _, err := t.Exec(ctx, `INSERT INTO bank_transfers (scope, idem_key, from_account, to_account, amount, status) VALUES ($1, $2, $3, $4, $5, 'declined')`,
			scope, key, req.From, req.To, req.Amount); err != nil {
			dbError(w)
			return
		}
		writeProblem(w, http.StatusPaymentRequired, "insufficient-funds", "Insufficient funds",
			fmt.Sprintf("Account %d has %d, less than %d.", req.From, balances[req.From], req.Amount), nil)
		return
	}
	rc := transferReceipt{From: req.From, To: req.To, Amount: req.Amount, Status: "done"}
	batch := &pgx.Batch{}
	batch.Queue(`UPDATE bank_accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance`, req.From, req.Amount).QueryRow(func(row pgx.Row) error {
		return row.Scan(&rc.FromBalance)
	})
	batch.Queue(`UPDATE bank_accounts SET balance = balance + $2 WHERE id = $1`, req.To, req.Amount)
	batch.Queue(`INSERT INTO bank_transfers (scope, idem_key, from_account, to_account, amount, status) VALUES ($1, $2, $3, $4, $5, 'done') RETURNING id`,
		scope, key, req.From, req.To, req.Amount).QueryRow(func(row pgx.Row) error { return row.Scan(&rc.ID) })
	if err := t.SendBatch(ctx, batch).Close(); err != nil {
		dbError(w)
		return
	}
	// The outbox: the job exists, and the event is published, if and only if the transfer
	// commits.
	if _, err := a.river.InsertTx(ctx, t, notifyArgs{Event: "transfer.done", Ref: scope + "/" + key}, nil); err != nil {
		dbError(w)
		return
	}
	if err := appendTransferCompleted(ctx, t, transferCompleted{TransferID: rc.ID, Scope: scope, Key: key, From: req.From, To: req.To, Amount: req.Amount}); err != nil {
		dbError(w)
		return
	}
	_ = a.crash.reach(ctx, "transfer:before-commit") // only ever armed to kill the process
	writeJSON(w, http.StatusCreated, rc)
}

// dbError answers 503: a 5xx is never stored, so the middleware rolls back and the client's
// retry runs afresh.
func dbError(w http.ResponseWriter) {
	unavailable(w, "Nothing was done; retry with the same key.")
}

// unavailable answers 503 database-error with the Retry-After every 503 of the bank carries, so
// that a client knows when to come back.
func unavailable(w http.ResponseWriter, detail string) {
	w.Header().Set("Retry-After", "1")
	writeProblem(w, http.StatusServiceUnavailable, "database-error", "Database error", detail, nil)
}

// createPayout runs the payout workflow under the request's key and answers with its receipt.
// A retry of a finished payout replays it; a payout in progress elsewhere answers 409 with
// Retry-After; a payout whose process died is resumed by the recovery worker, or by the retry
// that finds its lease expired.
func (a *app) createPayout(w http.ResponseWriter, r *http.Request) {
	scope := scopeOf(r)
	id, err := idemhttp.ParseKey(r.Header.Get(idemhttp.DefaultKeyHeader))
	if scope == "" || err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "Customer and Idempotency-Key required", "Send X-Customer and a valid Idempotency-Key.", nil)
		return
	}
	var req struct {
		Account int64 `json:"account"`
		Amount  int64 `json:"amount"`
		Confirm bool  `json:"confirm"` // the provider confirms the charge later, by webhook
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "Invalid payout", `Send {"account": id, "amount": > 0}.`, nil)
		return
	}
	// Out of the caller's own accounts only, checked before the run: a refusal runs nothing and
	// is not stored, as for transfers. Owners never change, so the check cannot go stale.
	var owner string
	err = a.pool.QueryRow(r.Context(), `SELECT owner FROM bank_accounts WHERE id = $1`, req.Account).Scan(&owner)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && owner != customerOf(r)):
		noSuchAccount(w, req.Account)
		return
	case err != nil:
		unavailable(w, "Nothing was done; retry with the same key.")
		return
	}
	var replayed bool
	in := payoutInput{Scope: scope, Key: id, Account: req.Account, Amount: req.Amount, Confirm: req.Confirm}
	rc, err := a.payout.Run(r.Context(), a.engine, idem.Key{Scope: scope, ID: id}, in, &workflow.RunOpts{Replayed: &replayed})

	var inFlight *idem.InFlightError
	switch {
	case err == nil:
		if replayed {
			w.Header().Set(idemhttp.DefaultReplayedHeader, "true")
		}
		writePayout(w, rc)
	case errors.As(err, &inFlight):
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(inFlight.RetryAfter.Seconds()+0.999))))
		writeProblem(w, http.StatusConflict, "payout-in-progress", "Payout in progress", "Retry after Retry-After with the same key.", nil)
	case errors.Is(err, idem.ErrMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, "idempotency-key-reused", "Idempotency key reused", "This key was used for another payout.", nil)
	case errors.Is(err, workflow.ErrFailed):
		// A stored failure is final, so it is a 4xx: a 5xx would make generic clients retry it
		// over and over. Marked as a replay, it also stops idemhttp.Transport.
		if replayed {
			w.Header().Set(idemhttp.DefaultReplayedHeader, "true")
		}
		writeProblem(w, http.StatusUnprocessableEntity, "payout-failed", "Payout failed", err.Error(), nil)
	default:
		// The run stopped without an outcome (this process lost its lease, or Postgres went
		// away): it is resumed in the background, and a retry gets its result.
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, "payout-interrupted", "Payout interrupted", "The payout will be completed; retry with the same key.", nil)
	}
}

// writePayout renders a receipt. It depends on the receipt only, so every answer for one payout
// has the same body.
func writePayout(w http.ResponseWriter, rc payoutReceipt) {
	if rc.Status == "settled" {
		writeJSON(w, http.StatusOK, rc)
		return
	}
	writeProblem(w, http.StatusPaymentRequired, "payout-"+rc.Status, "Payout "+rc.Status, rc.Reason, &rc)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// problem is an RFC 9457 problem, with the payout it is about when there is one.
type problem struct {
	Type   string         `json:"type"`
	Title  string         `json:"title"`
	Status int            `json:"status"`
	Detail string         `json:"detail"`
	Payout *payoutReceipt `json:"payout,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, name, title, detail string, payout *payoutReceipt) {
	body, _ := json.Marshal(problem{Type: problemBase + name, Title: title, Status: status, Detail: detail, Payout: payout})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
