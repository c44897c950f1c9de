package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

// ErrDeadlineExceeded is matched by a *TimedOutError: the run's deadline (RunOpts.Timeout)
// passed before it finished. The run stopped at a step boundary and is stored as timed out;
// every retry with its key gets the same error.
//
//	if errors.Is(err, workflow.ErrDeadlineExceeded) { ... } // final: do not retry with this key
var ErrDeadlineExceeded = errors.New("workflow: run's deadline was exceeded")

// TimedOutError is the stored outcome of a run whose deadline passed, returned to every call
// with its key.
//
//	var timedOut *workflow.TimedOutError
//	if errors.As(err, &timedOut) {
//		log.Printf("payout %s timed out", timedOut.ID)
//	}
type TimedOutError struct {
	Workflow  string // the workflow's name
	Scope, ID string // the run's key
	Message   string // as stored
}

// Error implements error.
func (e *TimedOutError) Error() string {
	return fmt.Sprintf("workflow %q (key %q in scope %q) timed out: %s", e.Workflow, e.ID, e.Scope, e.Message)
}

// Is makes errors.Is(err, ErrDeadlineExceeded) true.
func (e *TimedOutError) Is(target error) bool { return target == ErrDeadlineExceeded }

const deadlineMessage = "the run's deadline passed before it finished"

func timedOutFromStored(name string, key idem.Key, result []byte) error {
	f := failedFromStored(name, key, result).(*FailedError)
	return &TimedOutError{Workflow: name, Scope: key.Scope, ID: key.ID, Message: f.Message}
}

// startClock sets the clocks of a run this process starts: created is Postgres's time of its
// start in µs (0 when its row is not written yet). The deadline counts from when the start was
// sent (rs.started), which is no later than Postgres's created_at, so that this process's
// deadline never falls after the stored one: a step boundary after the stored deadline is
// always past this one too.
func (rs *runState) startClock(created int64) {
	rs.dbNow = created
	if rs.timeout > 0 {
		rs.deadline = rs.started.Add(rs.timeout)
	}
}

// setClock sets the clocks of a run taken over or woken: now is Postgres's time in µs, deadline
// the stored deadline. The deadline is kept by this process's clock from here on, as an offset
// from Postgres's now, so that clocks that disagree do not move it.
func (rs *runState) setClock(now int64, deadline *int64) {
	rs.dbNow = now
	rs.deadline = time.Time{}
	if deadline != nil {
		rs.deadline = rs.e.now().Add(time.Duration(*deadline-now) * time.Microsecond)
	}
}

func (rs *runState) deadlinePassed() bool {
	return !rs.deadline.IsZero() && !rs.e.now().Before(rs.deadline)
}

// timeOut stores the run as timed out, with what its open transaction holds and the pending
// writes. When that fails the run is left to its lease, and whoever resumes it times it out.
func (rs *runState) timeOut(ctx context.Context) outcome {
	result := encodeFailure(deadlineMessage)
	if err := rs.finish(ctx, store.RunTimedOut, result); err != nil {
		return rs.e.abandon(ctx, rs, err)
	}
	return finished(nil, timedOutFromStored(rs.def.Name(), idemKey(rs), result))
}
