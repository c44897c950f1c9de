package steps

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/workflow"
)

// Sleep waits d, durably: the wake-up time (d after the step is first reached, by Postgres's
// clock) is the step's checkpoint, and the run gives up its lease and its goroutine until then
// (the caller of Workflow.Run gets idem.ErrInFlight). A River job scheduled at that time
// continues the run, in whichever process works it; a crash or a Postgres restart in between
// changes nothing. A run resumed after its sleep is over passes straight through.
//
//	if err := steps.Sleep(ctx, "cool-off", 72*time.Hour); err != nil {
//		return Receipt{}, err
//	}
//
// The run wakes at its time by Postgres's clock, never before, and late by about River's
// FetchPollInterval (plus however long River's workers are busy); see the README for the
// settings. A d of 0 or less is a checkpoint that does not wait.
func Sleep(ctx context.Context, name string, d time.Duration) error {
	return workflow.SleepStep(ctx, name, d, time.Time{})
}

// SleepUntil is [Sleep] until t. A t in the past does not wait.
//
//	err := steps.SleepUntil(ctx, "until-settlement", req.SettlesAt)
func SleepUntil(ctx context.Context, name string, t time.Time) error {
	if t.IsZero() {
		return fmt.Errorf("steps: SleepUntil %q needs a time; t is zero", name)
	}
	return workflow.SleepStep(ctx, name, 0, t)
}

// Await waits for the signal named signal, sent to the run with workflow.Engine.SignalTx, and
// returns its payload decoded into T. Signals wait in the run's mailbox, so one sent before the
// run gets here is returned at once; otherwise the run suspends, holding no lease, goroutine,
// connection or River worker, until the signal's transaction commits (which wakes it through a
// River job) or timeout passes. Each signal is consumed by one await, exactly once, in the order
// signals of that name were sent: the consumption commits with the step's checkpoint.
//
//	conf, err := steps.Await[Confirmation](ctx, "confirmation", "charge.confirmed", 24*time.Hour)
//	if errors.Is(err, workflow.ErrAwaitTimeout) {
//		return release(ctx, hold) // no confirmation came: give the hold back
//	}
//
// When timeout passes first, it returns a *workflow.AwaitTimeoutError (errors.Is(err,
// workflow.ErrAwaitTimeout)); the timeout counts from when the await was first reached, and is
// stored, so a resumed run takes the same branch. A timeout of 0 waits without a bound.
func Await[T any](ctx context.Context, name, signal string, timeout time.Duration) (T, error) {
	var zero T
	data, err := workflow.AwaitStep(ctx, name, signal, timeout)
	if err != nil {
		return zero, err
	}
	return decode[T](ctx, name, data)
}

// SetEvent publishes value as the run's event name, a checkpointed step: the last value set
// under a name wins, and a reader (workflow.Engine.EventGet, workflow.GetEvent) sees it once the
// step has committed, at the latest when the run's next step begins. Use it for progress, or a
// status that a polling client shows.
//
//	if err := steps.SetEvent(ctx, "status", "waiting for the bank"); err != nil {
//		return Receipt{}, err
//	}
func SetEvent(ctx context.Context, name string, value any) error {
	data, err := encode(name, value)
	if err != nil {
		return err
	}
	return workflow.SetEventStep(ctx, name, data)
}
