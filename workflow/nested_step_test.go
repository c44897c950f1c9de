package workflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// TestStepInsideABranchIsRefused: a step called from inside a parallel branch's function (with
// the context the branch's function received) would take a position in the run whenever the
// branch happens to get there, in a race with the workflow's own line, so that a replay could
// not find it again. It is refused at once, saying so, as a step called inside a step of the
// workflow's own line is; the workflow's line runs nothing of it.
func TestStepInsideABranchIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.Define("nested", func(ctx context.Context, in int) (int, error) {
		f := steps.GoCall(ctx, "outer", func(ctx context.Context, _ string) (int, error) {
			return steps.Call(ctx, "inner", func(context.Context, string) (int, error) { return 1, nil }, nil)
		}, &steps.Opts{MaxAttempts: 1})
		return f.Get(ctx)
	})
	e := b.engine(t, fastConfig(wf))
	_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "k"}, 1, nil)
	require.ErrorContains(t, err, `step "inner" was called inside the function of step "outer"`)
	run, err := e.RunGet(b.ctx, idem.Key{Scope: "s", ID: "k"})
	require.NoError(t, err)
	for _, s := range run.Steps {
		require.NotEqual(t, "inner", s.Name, "the inner step took no position in the run")
	}
}
