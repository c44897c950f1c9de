// Package patching shows how to change a workflow that has runs in progress, in the three
// deploys of workflow.Patched, and how to test that with the test engine of package workflowtest
// (payout_test.go): a payout that cools off for three days before it charges gets a fraud check
// before the cool-off.
//
// A run that is asleep in the cool-off when the change is deployed has passed the point where
// the fraud check goes: its history holds the cool-off there. Code that simply inserted the
// step would no longer match that history, and the run would fail as nondeterministic when it
// wakes. So the change goes out in three deploys:
//
//  1. Deploy the change behind workflow.Patched (PayoutPatched): new runs, and runs that had
//     not got that far, take the new branch and record a marker; runs that had passed it take
//     the old one.
//  2. When no run started before deploy 1 is left unfinished (idem runs list --version with the
//     old versions and --state queued,running,sleeping,awaiting shows none), keep only the new
//     code, and replace Patched with workflow.Deprecated (PayoutDeprecated): runs that recorded
//     the marker still find it where it was.
//  3. When no run that recorded the marker is left, remove Deprecated (PayoutFinal).
//
// Before each deploy, replay the unfinished runs against the new code (idem runs check, built
// with the application's workflows, or workflowtest.ReplayAll over idem runs export): it names
// every run the deploy would break, and where.
package patching

import (
	"context"
	"time"

	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// Request is a payout to make.
type Request struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// Receipt is what a payout did.
type Receipt struct {
	Charge  string `json:"charge"`
	Checked bool   `json:"checked"` // a fraud check ran
}

// CoolOff is how long a payout waits before it charges.
const CoolOff = 72 * time.Hour

// Provider is the payment provider's API; the tests replace its calls with fakes.
type Provider interface {
	Check(ctx context.Context, key string, req Request) (bool, error)
	Charge(ctx context.Context, key string, req Request) (string, error)
}

// steps of every version.

func reserve(ctx context.Context, req Request) error {
	_, err := steps.Call(ctx, "reserve", func(ctx context.Context, key string) (string, error) { return "held", nil }, nil)
	return err
}

func fraudCheck(ctx context.Context, psp Provider, req Request) error {
	_, err := steps.Call(ctx, "fraud-check", func(ctx context.Context, key string) (bool, error) { return psp.Check(ctx, key, req) }, nil)
	return err
}

func coolOffAndCharge(ctx context.Context, psp Provider, req Request, checked bool) (Receipt, error) {
	if err := steps.Sleep(ctx, "cool-off", CoolOff); err != nil {
		return Receipt{}, err
	}
	charge, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (string, error) { return psp.Charge(ctx, key, req) }, nil)
	return Receipt{Charge: charge, Checked: checked}, err
}

// PayoutV1 is the code before the change.
func PayoutV1(psp Provider) *workflow.Workflow[Request, Receipt] {
	return workflow.Define("payout", func(ctx context.Context, req Request) (Receipt, error) {
		if err := reserve(ctx, req); err != nil {
			return Receipt{}, err
		}
		return coolOffAndCharge(ctx, psp, req, false)
	})
}

// PayoutUnpatched is the change made the wrong way: the step inserted without a patch. A run
// asleep in the cool-off would fail when it wakes; the replay check says so before the deploy.
func PayoutUnpatched(psp Provider) *workflow.Workflow[Request, Receipt] {
	return workflow.Define("payout", func(ctx context.Context, req Request) (Receipt, error) {
		if err := reserve(ctx, req); err != nil {
			return Receipt{}, err
		}
		if err := fraudCheck(ctx, psp, req); err != nil {
			return Receipt{}, err
		}
		return coolOffAndCharge(ctx, psp, req, true)
	})
}

// PayoutPatched is deploy 1: the change behind a patch.
func PayoutPatched(psp Provider) *workflow.Workflow[Request, Receipt] {
	return workflow.Define("payout", func(ctx context.Context, req Request) (Receipt, error) {
		if err := reserve(ctx, req); err != nil {
			return Receipt{}, err
		}
		patched, err := workflow.Patched(ctx, "fraud-check")
		if err != nil {
			return Receipt{}, err
		}
		if patched {
			if err := fraudCheck(ctx, psp, req); err != nil {
				return Receipt{}, err
			}
		}
		return coolOffAndCharge(ctx, psp, req, patched)
	})
}

// PayoutDeprecated is deploy 2: every run that is left takes the new branch.
func PayoutDeprecated(psp Provider) *workflow.Workflow[Request, Receipt] {
	return workflow.Define("payout", func(ctx context.Context, req Request) (Receipt, error) {
		if err := reserve(ctx, req); err != nil {
			return Receipt{}, err
		}
		if err := workflow.Deprecated(ctx, "fraud-check"); err != nil {
			return Receipt{}, err
		}
		if err := fraudCheck(ctx, psp, req); err != nil {
			return Receipt{}, err
		}
		return coolOffAndCharge(ctx, psp, req, true)
	})
}

// PayoutFinal is deploy 3: the code as if it had always been so.
func PayoutFinal(psp Provider) *workflow.Workflow[Request, Receipt] { return PayoutUnpatched(psp) }
