package workflow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/workflow"
)

// TestCustomStepKindRetriesLostConnections: a step kind of one's own, built on RunStep, whose
// call to the outside world fails with a lost connection (a network error is not Postgres's),
// is retried like any failed attempt. A lost connection stops the run only for steps whose
// work is a Postgres transaction (RunStepTx), where it says nothing about the step.
func TestCustomStepKindRetriesLostConnections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	wf := workflow.Define("webhook", func(ctx context.Context, in int) (int, error) {
		out, err := workflow.RunStep(ctx, "webhook", "post", &workflow.StepOpts{MaxAttempts: 3, MinBackoff: time.Millisecond},
			func(ctx context.Context, info *workflow.StepInfo) ([]byte, error) {
				if calls.Add(1) == 1 {
					return nil, fmt.Errorf("posting the webhook: %w", io.ErrUnexpectedEOF)
				}
				return json.Marshal(in * 2)
			})
		if err != nil {
			return 0, err
		}
		var v int
		return v, json.Unmarshal(out, &v)
	})
	out, err := wf.Run(b.ctx, b.engine(t, fastConfig(wf)), idem.Key{Scope: "s", ID: "k"}, 21, nil)
	require.NoError(t, err)
	require.Equal(t, 42, out)
	require.EqualValues(t, 2, calls.Load(), "the lost connection was an attempt that failed, and the next one ran")
	state, _ := b.state(t, idem.Key{Scope: "s", ID: "k"})
	require.Equal(t, "done", state)
}
