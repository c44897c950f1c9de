package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// TestTimedOutParentFreesItsChildsSlot: a parent that times out while it runs cancels its
// children, and a cancelled child of a limited workflow hands its slot on: the run queued
// behind it starts, as it does when the child ends any other way.
func TestTimedOutParentFreesItsChildsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lane := workflow.Define("lane", func(ctx context.Context, in string) (string, error) {
		if err := steps.Sleep(ctx, "hold", time.Hour); err != nil { // keeps its slot
			return "", err
		}
		return in, nil
	}).WithConcurrency(1, func(in string) string { return "lane-key" })
	parent := workflow.Define("holder", func(ctx context.Context, in string) (string, error) {
		if _, err := steps.StartChild(ctx, "start", lane, "child", nil); err != nil {
			return "", err
		}
		if _, err := steps.Call(ctx, "slow", func(ctx context.Context, _ string) (int, error) {
			time.Sleep(1500 * time.Millisecond) // past the run's deadline
			return 1, nil
		}, nil); err != nil {
			return "", err
		}
		return steps.Call(ctx, "after", func(ctx context.Context, _ string) (string, error) { return "unreached", nil }, nil)
	})
	e := b.engine(t, fastConfig(lane, parent))
	b.startRiver(t, e)

	parentKey := idem.Key{Scope: "s", ID: "parent"}
	done := make(chan error, 1)
	go func() {
		_, err := parent.Run(b.ctx, e, parentKey, "in", &workflow.RunOpts{Timeout: time.Second})
		done <- err
	}()
	eventually(t, 10*time.Second, "the child to hold the lane", func() bool {
		return b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'lane' AND state = 'sleeping'`) == 1
	})
	soloKey := idem.Key{Scope: "s", ID: "solo"}
	_, err := lane.Run(b.ctx, e, soloKey, "solo", nil)
	require.ErrorIs(t, err, idem.ErrInFlight)
	state, _ := b.state(t, soloKey)
	require.Equal(t, "queued", state)

	require.ErrorIs(t, <-done, workflow.ErrDeadlineExceeded)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'lane' AND id <> 'solo' AND state = 'cancelled'`),
		"the parent's timeout cancelled its child")
	eventually(t, 10*time.Second, "the queued run to start once the child's slot is free", func() bool {
		state, _ := b.state(t, soloKey)
		return state == "sleeping"
	})
}
