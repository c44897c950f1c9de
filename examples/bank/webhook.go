package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/tx"
	"github.com/idemkit/idem/workflow"
)

// providerWebhook receives the provider's confirmation of a pending charge. In one transaction
// it records the webhook and signals the payout that awaits it: both commit or neither, and a
// failure answers 5xx so that the provider delivers again. The provider's event id is the
// signal's dedupe id, so a webhook delivered twice wakes the payout once.
func (a *app) providerWebhook(w http.ResponseWriter, r *http.Request) {
	var ev webhookEvent
	if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || ev.EventID == "" || ev.ChargeID == "" {
		writeProblem(w, http.StatusBadRequest, "invalid-webhook", "Invalid webhook", "Send {event_id, charge_id, ref}.", nil)
		return
	}
	scope, id, ok := strings.Cut(ev.Ref, "/")
	if !ok {
		writeProblem(w, http.StatusBadRequest, "invalid-webhook", "Invalid webhook", "ref must be scope/key.", nil)
		return
	}
	var res *workflow.SignalResult
	err := tx.Run(r.Context(), a.pool, func(ctx context.Context, t pgx.Tx) error {
		if _, err := t.Exec(ctx, `INSERT INTO bank_webhooks (event_id, charge_id, ref) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
			ev.EventID, ev.ChargeID, ev.Ref); err != nil {
			return err
		}
		var err error
		res, err = a.engine.SignalTx(ctx, t, idem.Key{Scope: scope, ID: id}, "charge.confirmed", ev.ChargeID,
			&workflow.SignalOpts{DedupeID: ev.EventID})
		return err
	})
	switch {
	case errors.Is(err, workflow.ErrRunFinished), errors.Is(err, workflow.ErrRunNotFound):
		// The payout gave up waiting and canceled the charge, which the provider will not
		// confirm after that; nothing to do, and nothing to deliver again.
		writeJSON(w, http.StatusOK, map[string]any{"received": true, "late": true})
	case err != nil:
		unavailable(w, "The webhook was not recorded; deliver it again.")
	default:
		writeJSON(w, http.StatusOK, map[string]any{"received": true, "duplicate": res.Duplicate})
	}
}
