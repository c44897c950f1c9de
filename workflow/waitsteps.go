package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/store"
)

// ErrAwaitTimeout is matched by an *AwaitTimeoutError: an await's timeout passed before the
// signal came. The timeout is the step's stored outcome, so a resumed run takes the same branch.
//
//	if errors.Is(err, workflow.ErrAwaitTimeout) {
//		return release(ctx, hold) // no confirmation: give the money back
//	}
var ErrAwaitTimeout = errors.New("workflow: await timed out")

// AwaitTimeoutError is returned by an await (steps.Await) whose timeout passed before a signal
// of its name was sent.
//
//	var timeout *workflow.AwaitTimeoutError
//	if errors.As(err, &timeout) {
//		log.Printf("no %s within %s", timeout.Signal, timeout.Timeout)
//	}
type AwaitTimeoutError struct {
	Step    string        // the await step's name
	Signal  string        // the signal it waited for
	Timeout time.Duration // as given to the await
}

// Error implements error.
func (e *AwaitTimeoutError) Error() string {
	return fmt.Sprintf("workflow: step %q received no signal %q within %s", e.Step, e.Signal, e.Timeout)
}

// Is makes errors.Is(err, ErrAwaitTimeout) true.
func (e *AwaitTimeoutError) Is(target error) bool { return target == ErrAwaitTimeout }

// SleepStep is the step behind steps.Sleep and steps.SleepUntil: it waits until d after the
// step is first reached (by Postgres's clock), or until until when it is not zero. The wake-up
// time is the step's checkpoint. A wake-up in the future suspends the run: its lease and its
// goroutine are given up (the caller of Workflow.Run gets idem.ErrInFlight), and a River job
// scheduled at that time continues it; a resumed run whose sleep is over passes through.
// Package steps is the intended caller.
//
//	err := workflow.SleepStep(ctx, "cool-off", 72*time.Hour, time.Time{})
func SleepStep(ctx context.Context, name string, d time.Duration, until time.Time) error {
	out, err := runStep(ctx, "sleep", name, nil, false, func(ctx context.Context, s *StepInfo) ([]byte, error) {
		var out []byte
		err := s.rs.waitTx(ctx, name, func(t pgx.Tx, w *store.WaitRow) (bool, error) {
			wake := w.Now + d.Microseconds()
			if !until.IsZero() {
				wake = until.UnixMicro()
			}
			out = strconv.AppendInt(nil, wake, 10)
			if _, err := s.rs.e.st.StepCheckpointInFenced(s.rs.checkpointParams(s, out, nil)).Exec(ctx, t); err != nil {
				return false, err
			}
			if wake <= w.Now {
				return false, nil
			}
			return true, s.rs.suspend(ctx, t, w, store.RunSleeping, s.Seq, nil, &wake)
		})
		return out, err
	})
	if err != nil {
		return err
	}
	rs, _ := runFrom(ctx)
	var wake int64
	if err := json.Unmarshal(out, &wake); err != nil {
		return StopRun(ctx, fmt.Errorf("workflow: stored wake-up of step %q cannot be decoded: %w", name, err))
	}
	if wake <= rs.dbNow {
		return nil
	}
	// Replayed before its time (the run was resumed early, by the recovery scan or a restart
	// after a failed commit): wait again, for the same time.
	if rs.deadlinePassed() {
		return rs.stop(errDeadline)
	}
	if err := rs.boundary(ctx, false); err != nil {
		return err
	}
	rs.mu.Lock()
	seq := rs.next - 1
	rs.mu.Unlock()
	return rs.waitTx(ctx, name, func(t pgx.Tx, w *store.WaitRow) (bool, error) {
		if wake <= w.Now {
			return false, nil
		}
		return true, rs.suspend(ctx, t, w, store.RunSleeping, seq, nil, &wake)
	})
}

// awaitOutcome is an await step's stored output.
type awaitOutcome struct {
	Signal   int64           `json:"signal,omitempty"` // the consumed signal's seq
	Payload  json.RawMessage `json:"payload,omitempty"`
	TimedOut bool            `json:"timed_out,omitempty"`
}

// AwaitStep is the step behind steps.Await: it returns the payload (JSON) of the oldest signal
// named signal that the run has not consumed yet, marking it consumed in the transaction of the
// step's checkpoint. When there is none, the run suspends (as in [SleepStep]) until one is sent
// with [Engine.SignalTx], or until timeout after the await was first reached, when it returns
// an *AwaitTimeoutError. A timeout of 0 waits without a bound (the run's deadline still
// applies). Package steps is the intended caller.
//
//	payload, err := workflow.AwaitStep(ctx, "confirmation", "charge.confirmed", 24*time.Hour)
func AwaitStep(ctx context.Context, name, signal string, timeout time.Duration) (json.RawMessage, error) {
	if signal == "" || len(signal) > 255 {
		return nil, errors.New("workflow: signal name must be 1 to 255 bytes")
	}
	if timeout < 0 {
		return nil, fmt.Errorf("workflow: await timeout cannot be negative (got %s)", timeout)
	}
	out, err := runStep(ctx, "await", name, nil, false, func(ctx context.Context, s *StepInfo) ([]byte, error) {
		var out []byte
		err := s.rs.waitTx(ctx, name, func(t pgx.Tx, w *store.WaitRow) (bool, error) {
			rs := s.rs
			var got awaitOutcome
			sig, ok, err := rs.e.st.SignalConsume(ctx, t, rs.scope, rs.id, signal, s.Seq)
			switch {
			case err != nil:
				return false, err
			case ok:
				got.Signal, got.Payload = sig.Seq, sig.Payload
			default:
				// The timeout counts from when this await was first reached, kept with the run.
				var until *int64
				if w.Seq != nil && *w.Seq == s.Seq && w.Name != nil && *w.Name == signal {
					until = w.WakeAt
				} else if timeout > 0 {
					at := w.Now + timeout.Microseconds()
					until = &at
				}
				if until == nil || *until > w.Now {
					return true, rs.suspend(ctx, t, w, store.RunAwaiting, s.Seq, &signal, until)
				}
				got = awaitOutcome{TimedOut: true}
			}
			if out, err = json.Marshal(got); err != nil {
				return false, err
			}
			_, err = rs.e.st.StepCheckpointInFenced(rs.checkpointParams(s, out, nil)).Exec(ctx, t)
			return false, err
		})
		return out, err
	})
	if err != nil {
		return nil, err
	}
	var got awaitOutcome
	if err := json.Unmarshal(out, &got); err != nil {
		return nil, StopRun(ctx, fmt.Errorf("workflow: stored outcome of await %q cannot be decoded: %w", name, err))
	}
	if got.TimedOut {
		return nil, &AwaitTimeoutError{Step: name, Signal: signal, Timeout: timeout}
	}
	return got.Payload, nil
}
