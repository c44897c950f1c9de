package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/backoff"
)

// ErrEventNotSet means the run has not published the event (yet): [Engine.EventGet] waited as
// long as it was told, or the run finished without setting it.
//
//	if errors.Is(err, workflow.ErrEventNotSet) { ... } // 202: ask again later
var ErrEventNotSet = errors.New("workflow: event is not set")

// SetEventStep is the step behind steps.SetEvent: it publishes value (JSON) as the run's event
// name, in a step's transaction, so a resumed run does not publish it again and a reader never
// sees a value from a step that did not commit. A later SetEvent of the same name replaces it.
// The step's output is the value, so that the history says what each step set, and a fork
// (Engine.RunFork) gets the events its copied steps set.
// The value is visible once the step commits: at the latest when the run's next step begins, or
// when it waits or ends. Package steps is the intended caller.
//
//	err := workflow.SetEventStep(ctx, "status", []byte(`"charging"`))
func SetEventStep(ctx context.Context, name string, value []byte) error {
	if !json.Valid(value) {
		return fmt.Errorf("workflow: value of event %q is not JSON", name)
	}
	_, err := RunStepTx(ctx, "event", name, nil, func(ctx context.Context, t pgx.Tx, info *StepInfo) ([]byte, error) {
		rs := info.rs
		if err := rs.e.st.EventSet(ctx, t, rs.scope, rs.id, name, value, rs.created); err != nil {
			return nil, fmt.Errorf("error publishing event %q: %w", name, err)
		}
		return value, nil
	})
	return err
}

// EventGet returns the value (JSON) the run under key published as its event name (see
// steps.SetEvent), waiting up to wait for it to be set. It polls: every 10ms at first, backing
// off to every 250ms, one indexed read each time, and it holds no connection between reads.
// After wait, or at once when the run has finished without setting it, it returns
// ErrEventNotSet; a key with no run (after wait) gets ErrRunNotFound.
//
//	status, err := engine.EventGet(ctx, idem.Key{Scope: merchant, ID: payoutID}, "status", 5*time.Second)
func (e *Engine) EventGet(ctx context.Context, key idem.Key, name string, wait time.Duration) (json.RawMessage, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	poll := backoff.NewPoll(wait, 10*time.Millisecond, 250*time.Millisecond)
	for {
		ev, found, err := e.st.EventGet(ctx, e.db, key.Scope, key.ID, name)
		switch {
		case err != nil:
			return nil, fmt.Errorf("workflow: error reading event: %w", e.tablesError(err))
		case ev.Set:
			return ev.Value, nil
		case found && ev.State.Finished():
			return nil, fmt.Errorf("%w: run of key %q in scope %q is %s without event %q", ErrEventNotSet, key.ID, key.Scope, ev.State, name)
		}
		again, err := poll.Next(ctx)
		switch {
		case err != nil:
			return nil, fmt.Errorf("workflow: gave up waiting for event: %w", err)
		case !again && !found:
			return nil, fmt.Errorf("%w: key %q in scope %q", ErrRunNotFound, key.ID, key.Scope)
		case !again:
			return nil, fmt.Errorf("%w: run of key %q in scope %q has no event %q", ErrEventNotSet, key.ID, key.Scope, name)
		}
	}
}

// GetEvent is [Engine.EventGet] decoding the value into T.
//
//	status, err := workflow.GetEvent[PayoutStatus](ctx, engine, key, "status", 5*time.Second)
func GetEvent[T any](ctx context.Context, e *Engine, key idem.Key, name string, wait time.Duration) (T, error) {
	var v T
	data, err := e.EventGet(ctx, key, name, wait)
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return v, fmt.Errorf("workflow: event %q cannot be decoded into %T: %w", name, v, err)
	}
	return v, nil
}
