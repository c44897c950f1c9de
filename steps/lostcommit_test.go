package steps_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// TestTxLostCommit loses the acknowledgement of a Tx step's COMMIT (the step landed, or did
// not): the step must be neither lost nor done twice.
func TestTxLostCommit(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name     string
		fault    func(*faultproxy.Proxy)
		wantRuns int32
	}{
		{"CommitLandedReplyLost", (*faultproxy.Proxy).LoseNextCommitReply, 1}, // the rerun finds the checkpoint
		{"CommitNeverArrived", (*faultproxy.Proxy).DropNextCommit, 2},         // the rerun does the step
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			pool, proxy := faultproxy.NewPool(t, b.pool.Config().ConnString())
			var runs atomic.Int32
			wf := workflow.Define("lost", func(ctx context.Context, in int) (int64, error) {
				return steps.Tx(ctx, "write", func(ctx context.Context, tx pgx.Tx) (int64, error) {
					var id int64
					err := tx.QueryRow(ctx, `INSERT INTO effects (note) VALUES ('w') RETURNING id`).Scan(&id)
					if runs.Add(1) == 1 {
						tt.fault(proxy)
					}
					return id, err
				}, nil)
			})
			e, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{wf}})
			require.NoError(t, err)
			id, err := wf.Run(b.ctx, e, key, 1, nil)
			require.NoError(t, err)
			require.Equal(t, tt.wantRuns, runs.Load())
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
			var stored int64
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id FROM effects`).Scan(&stored))
			require.Equal(t, stored, id)
		})
	}
}
