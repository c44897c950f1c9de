package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// payoutInput is what a payout run stores, so that any process can resume it. The key is in it
// so that the bank's rows can name the request they belong to.
type payoutInput struct {
	Scope   string `json:"scope"`
	Key     string `json:"key"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
	// Confirm asks the provider for a charge that it confirms later, by webhook; the payout
	// awaits the confirmation and releases the funds when none comes in time.
	Confirm bool `json:"confirm,omitempty"`
}

// confirmTimeout is how long a payout awaits the provider's confirmation of its charge.
const confirmTimeout = 2 * time.Second

// payoutReceipt is the payout's outcome, stored with its key and replayed to every retry.
type payoutReceipt struct {
	Account  int64  `json:"account"`
	Amount   int64  `json:"amount"`
	Status   string `json:"status"` // settled, released or declined
	ChargeID string `json:"charge_id,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// hold is the reserve step's output.
type hold struct {
	Declined bool   `json:"declined"`
	Reason   string `json:"reason,omitempty"`
	// RunCreated is the run's creation time in µs, read in the reserve step so that the release
	// path can name the charge step's key to the provider (workflow.StepKey) even on a resume
	// that replays the charge step's failure without running it.
	RunCreated int64 `json:"run_created"`
}

// chargeSeq is the charge step's position in the run: reserve is #1.
const chargeSeq = 2

// definePayout is the payout workflow: reserve (a transaction), charge the provider (an outside
// call with a stable key), settle or release (a transaction), notify (a River job). Each step is
// a recovery point: a process that dies anywhere leaves the run to be resumed from its last
// completed step, and the charge is made once because the provider honours the step's key.
func (a *app) definePayout() *workflow.Workflow[payoutInput, payoutReceipt] {
	return workflow.Define("bank.payout", func(ctx context.Context, in payoutInput) (payoutReceipt, error) {
		rc := payoutReceipt{Account: in.Account, Amount: in.Amount}

		h, err := steps.Tx(ctx, "reserve", func(ctx context.Context, t pgx.Tx) (hold, error) {
			return reserve(ctx, t, in)
		}, nil)
		if err != nil {
			return rc, err
		}
		if h.Declined {
			rc.Status, rc.Reason = "declined", h.Reason
			return rc, nil
		}
		if err := a.crash.reach(ctx, "payout:after-reserve"); err != nil {
			return rc, err
		}

		// resolve asks the provider what became of the charge under the charge step's key, and
		// makes it refuse that key from now on if it did not charge. Its retries are long:
		// until it answers, the payout's funds stay held.
		resolve := func(step string) (chargeResult, error) {
			chargeKey := workflow.StepKey(idem.Key{Scope: in.Scope, ID: in.Key}, time.UnixMicro(h.RunCreated), chargeSeq, "charge")
			return steps.Call(ctx, step, func(ctx context.Context, _ string) (chargeResult, error) {
				return a.provider.client.resolve(ctx, chargeKey)
			}, &steps.Opts{MaxAttempts: 30, MinBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second, Timeout: 10 * time.Second})
		}

		ch, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (chargeResult, error) {
			res, err := a.provider.client.charge(ctx, key, in.Account, in.Amount, in.Confirm, in.Scope+"/"+in.Key)
			if err == nil {
				// The provider has charged, the checkpoint is not written yet: the worst moment
				// to die, and the reason the key must be stable.
				err = a.crash.reach(ctx, "payout:in-charge")
			}
			return res, err
		}, &steps.Opts{MaxAttempts: 8, MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, Timeout: 10 * time.Second})
		if errors.Is(err, workflow.ErrStepFailed) {
			// The provider may have charged on an attempt whose answer never came back. Ask it,
			// and have it refuse the key from now on if not, so that a late attempt cannot charge
			// money this payout is about to release.
			ch, err = resolve("resolve")
		}
		if err != nil {
			// Funds stay held, and the stored failure tells the operator why.
			return rc, err
		}
		if ch.Pending {
			// The run gives up its goroutine and lease here until the provider's webhook
			// signals it (see providerWebhook) or the timeout passes.
			chargeID, err := steps.Await[string](ctx, "confirmation", "charge.confirmed", confirmTimeout)
			switch {
			case errors.Is(err, workflow.ErrAwaitTimeout):
				// No confirmation: cancel the pending charge, unless the provider confirmed
				// it meanwhile (then resolve answers the charge, and the payout settles).
				ch, err = resolve("cancel")
				if err != nil {
					return rc, err
				}
				if ch.ChargeID == "" {
					ch.Reason = fmt.Sprintf("the provider did not confirm the charge within %s; it was canceled", confirmTimeout)
				}
			case err != nil:
				return rc, err
			default:
				ch = chargeResult{ChargeID: chargeID}
			}
		}
		if err := a.crash.reach(ctx, "payout:after-charge"); err != nil {
			return rc, err
		}

		step := "settle"
		rc.ChargeID, rc.Status = ch.ChargeID, "settled"
		if ch.ChargeID == "" {
			step, rc.Status, rc.Reason = "release", "released", ch.Reason
		}
		if _, err := steps.Tx(ctx, step, func(ctx context.Context, t pgx.Tx) (struct{}, error) {
			return struct{}{}, settle(ctx, t, in, rc)
		}, nil); err != nil {
			return rc, err
		}
		if err := a.crash.reach(ctx, "payout:after-settle"); err != nil {
			return rc, err
		}

		// The outbox: the notify job is inserted in the step's own transaction, with its
		// checkpoint, so it exists once however often the run is resumed.
		if err := steps.Enqueue(ctx, "notify", notifyArgs{Event: "payout." + rc.Status, Ref: in.Scope + "/" + in.Key}, nil, nil); err != nil {
			return rc, err
		}
		if err := a.crash.reach(ctx, "payout:after-notify"); err != nil {
			return rc, err
		}
		return rc, nil
	})
}

// reserve moves the amount from balance to held, or declines the payout when the balance does
// not cover it. Either way the payout gets its row, in the step's transaction.
func reserve(ctx context.Context, t pgx.Tx, in payoutInput) (hold, error) {
	var h hold
	if err := t.QueryRow(ctx, `SELECT (extract(epoch FROM created_at) * 1000000)::int8 FROM idem_runs WHERE scope = $1 AND id = $2`,
		in.Scope, in.Key).Scan(&h.RunCreated); err != nil {
		return h, err
	}
	tag, err := t.Exec(ctx, `UPDATE bank_accounts SET balance = balance - $2, held = held + $2 WHERE id = $1 AND balance >= $2`, in.Account, in.Amount)
	if err != nil {
		return h, err
	}
	status := "reserved"
	if tag.RowsAffected() == 0 {
		h.Declined, h.Reason, status = true, fmt.Sprintf("account %d does not exist or has less than %d", in.Account, in.Amount), "declined"
	}
	_, err = t.Exec(ctx, `INSERT INTO bank_payouts (scope, idem_key, account, amount, status, reason) VALUES ($1, $2, $3, $4, $5, $6)`,
		in.Scope, in.Key, in.Account, in.Amount, status, h.Reason)
	return h, err
}

// settle ends the hold: the money leaves the bank (settled) or goes back to the balance
// (released).
func settle(ctx context.Context, t pgx.Tx, in payoutInput, rc payoutReceipt) error {
	back := int64(0)
	if rc.Status == "released" {
		back = in.Amount
	}
	tag, err := t.Exec(ctx, `UPDATE bank_accounts SET held = held - $2, balance = balance + $3 WHERE id = $1`, in.Account, in.Amount, back)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return steps.Permanent(fmt.Errorf("account %d is gone", in.Account))
	}
	_, err = t.Exec(ctx, `UPDATE bank_payouts SET status = $3, charge_id = nullif($4, ''), reason = nullif($5, '')
WHERE scope = $1 AND idem_key = $2 AND status = 'reserved'`, in.Scope, in.Key, rc.Status, rc.ChargeID, rc.Reason)
	return err
}

// crashPointNames are the places where -die-at can kill the process.
var crashPointNames = []string{
	"transfer:before-commit", // a transfer's writes are done, its transaction is not committed
	"payout:after-reserve",   // funds held, provider not called
	"payout:in-charge",       // the provider charged, the charge step has no checkpoint yet
	"payout:after-charge",    // charge checkpointed, not settled
	"payout:after-settle",    // settled, notification not queued
	"payout:after-notify",    // every step done, the run's outcome not stored
}

func validCrashPoint(p string) bool { return slices.Contains(crashPointNames, p) }
func crashPointList() string        { return strings.Join(crashPointNames, ", ") }

// crashPoints makes the process die at a named point, once. With -die-at it is a real death
// (SIGKILL: no deferred function, no rollback, no lease release); the demo arms it instead with
// a function that stops the run in place, which leaves the database exactly as a death would.
type crashPoints struct {
	mu    sync.Mutex
	point string
	die   func(ctx context.Context, point string) error
}

func newCrashPoints(point string) *crashPoints {
	c := &crashPoints{}
	if point != "" {
		c.arm(point, func(context.Context, string) error {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way; nothing else may happen
		})
	}
	return c
}

// arm makes the next arrival at point call die.
func (c *crashPoints) arm(point string, die func(ctx context.Context, point string) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.point, c.die = point, die
}

// reach is called at each point; it disarms and dies when the point is the armed one.
func (c *crashPoints) reach(ctx context.Context, point string) error {
	c.mu.Lock()
	if c.point != point {
		c.mu.Unlock()
		return nil
	}
	die := c.die
	c.point, c.die = "", nil
	c.mu.Unlock()
	return die(ctx, point)
}
