package workflow

import (
	"errors"
	"fmt"
)

// Limits on what a run stores, used when the corresponding Config field is zero. Every one of
// them is reached by what callers and workflow code hand the engine (an input, a step's output, a
// signal from a webhook), so none of them is unbounded: a client that sends a huge body, or a
// sender that signals a run that never awaits, cannot grow the tables without end.
//
//	cfg := &workflow.Config{MaxInputBytes: 4 * workflow.DefaultMaxInputBytes}
const (
	DefaultMaxInputBytes         = 1 << 20
	DefaultMaxStepOutputBytes    = 1 << 20
	DefaultMaxSignalPayloadBytes = 1 << 20
	DefaultMaxPendingSignals     = 10000
)

// ErrLimitExceeded is matched by a *LimitError: something was over one of the limits of
// [Config] (MaxInputBytes, MaxStepOutputBytes, MaxSignalPayloadBytes, MaxPendingSignals), and
// nothing of it was stored.
//
//	if errors.Is(err, workflow.ErrLimitExceeded) { ... } // 413, or 429 for a full mailbox
var ErrLimitExceeded = errors.New("workflow: over a limit")

// LimitError says which limit was exceeded, by how much, and what was refused.
//
//	var over *workflow.LimitError
//	if errors.As(err, &over) {
//		log.Printf("%s is %d, at most %d", over.Field, over.Size, over.Max)
//	}
type LimitError struct {
	Field string // the Config field of the limit, as "MaxInputBytes"
	What  string // what was refused, as `step "charge"'s output`
	Size  int    // its size in bytes, or the signals pending
	Max   int    // the limit
}

// Error implements error.
func (e *LimitError) Error() string {
	if e.Field == "MaxPendingSignals" {
		return fmt.Sprintf("workflow: %s: the run has %d signals pending, the most it may (Config.MaxPendingSignals); nothing was recorded, and the run must consume signals first",
			e.What, e.Size)
	}
	return fmt.Sprintf("workflow: %s is %d bytes, more than the limit of %d (Config.%s); nothing of it was stored", e.What, e.Size, e.Max, e.Field)
}

// Is makes errors.Is(err, ErrLimitExceeded) true.
func (e *LimitError) Is(target error) bool { return target == ErrLimitExceeded }

// Retryable reports false: the same input, output or payload is over the same limit on every
// attempt, so a step whose output is over it fails for good at once (steps.Permanent).
func (e *LimitError) Retryable() bool { return false }

// checkSize returns a *LimitError when data is over max.
func checkSize(field, what string, data []byte, max int) error {
	if len(data) <= max {
		return nil
	}
	return &LimitError{Field: field, What: what, Size: len(data), Max: max}
}

// checkStepOutput holds a step's output to Config.MaxStepOutputBytes.
func (rs *runState) checkStepOutput(s *StepInfo, out []byte) error {
	return checkSize("MaxStepOutputBytes", fmt.Sprintf("the output of step %q (#%d)", s.Name, s.Seq), out, rs.e.cfg.MaxStepOutputBytes)
}

// checkInput holds a run's input to Config.MaxInputBytes.
func (e *Engine) checkInput(workflow string, input []byte) error {
	return checkSize("MaxInputBytes", fmt.Sprintf("the input of a run of %q", workflow), input, e.cfg.MaxInputBytes)
}
