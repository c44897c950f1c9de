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

// TestChildOutcomeOutlivesItsTTLWhileTheParentRuns: a child that finished while its parent went
// on is kept, past its TTL, until its parent has finished, so that the parent's later wait for it
// reads its outcome; the reaper deletes it after that.
func TestChildOutcomeOutlivesItsTTLWhileTheParentRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	quick := workflow.Define("quick", func(ctx context.Context, in string) (string, error) {
		return steps.Call(ctx, "work", func(context.Context, string) (string, error) { return "label for " + in, nil }, nil)
	})
	parent := workflow.Define("patient", func(ctx context.Context, in string) (string, error) {
		child, err := steps.StartChild(ctx, "start", quick, in, nil)
		if err != nil {
			return "", err
		}
		if err := steps.Sleep(ctx, "meanwhile", 3*time.Second); err != nil { // longer than the TTL
			return "", err
		}
		return child.Wait(ctx, "label")
	})
	cfg := fastConfig(quick, parent)
	cfg.TTL = time.Second
	e := b.engine(t, cfg)
	b.startRiver(t, e)

	key := idem.Key{Scope: "s", ID: "order-1"}
	_, err := parent.Run(b.ctx, e, key, "o-1", nil)
	require.ErrorIs(t, err, idem.ErrInFlight) // asleep
	eventually(t, 10*time.Second, "the child to finish", func() bool {
		return b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'quick' AND state = 'done'`) == 1
	})
	eventually(t, 10*time.Second, "the child to be past its TTL", func() bool {
		return b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'quick' AND expires_at <= now()`) == 1
	})
	_, err = workflow.Reap(b.ctx, e)
	require.NoError(t, err)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'quick'`), "the child is kept while its parent runs")

	require.Equal(t, "done", b.waitFinished(t, key))
	out, err := parent.Get(b.ctx, e, key)
	require.NoError(t, err)
	require.Equal(t, "label for o-1", out)

	// Once the parent has finished (and expired), both go: the child when it is looked at
	// again, which is when it is twice as old as when it was kept.
	eventually(t, 20*time.Second, "the reaper to delete both runs", func() bool {
		_, err := workflow.Reap(b.ctx, e)
		require.NoError(t, err)
		return b.count(t, `SELECT count(*) FROM idem_runs`) == 0
	})
}
