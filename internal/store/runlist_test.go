package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// explainer runs EXPLAIN of each query it is given instead of the query, and keeps the plan.
type explainer struct {
	store.Querier
	plan string
}

func (x *explainer) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := x.Querier.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		return nil, err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	x.plan = strings.Join(lines, "\n")
	return nil, fmt.Errorf("explained: %w", err)
}

func (x *explainer) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	panic("not a query")
}

// TestRunListVersions: RunList filters on the version that started a run; the question an
// operator asks before deploying old code away (which unfinished runs of it are left?) is served
// by idem_runs_state, which holds no done run.
func TestRunListVersions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := store.For("")
	// 9300 runs of 30 versions, one in 31 of them asleep (unfinished runs are the few, as in a
	// service's table), so that the planner prefers the index of the unfinished states; one
	// taken over by another version.
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO idem_runs (scope, id, workflow, state, version, created_at)
SELECT 's', 'r' || i, 'w', CASE WHEN i % 31 = 0 THEN 'sleeping' ELSE 'done' END, 'v' || (i % 30), now() - i * interval '1 second'
FROM generate_series(1, 9300) AS i;
UPDATE idem_runs SET attempt_version = 'v99' WHERE id = 'r7';
INSERT INTO idem_runs (scope, id, workflow, state, created_at) VALUES ('s', 'old', 'w', 'done', now());
ANALYZE idem_runs`)
	require.NoError(t, err)

	runs, err := st.RunList(b.ctx, b.pool, store.RunFilter{Versions: []string{"v7", "v8"}, Limit: 1000})
	require.NoError(t, err)
	require.Len(t, runs, 620)
	for _, r := range runs {
		require.Contains(t, []string{"v7", "v8"}, r.Version)
		if r.ID == "r7" {
			require.Equal(t, "v99", r.AttemptVersion)
		} else {
			require.Equal(t, r.Version, r.AttemptVersion, "until a takeover or a wake-up, the attempt's version is the start's")
		}
	}
	runs, err = st.RunList(b.ctx, b.pool, store.RunFilter{Limit: 1})
	require.NoError(t, err)
	require.Equal(t, "old", runs[0].ID)
	require.Empty(t, runs[0].Version, "a run stored before versions has none")

	unfinished := []string{"queued", "running", "sleeping", "awaiting"}
	runs, err = st.RunList(b.ctx, b.pool, store.RunFilter{Versions: []string{"v9"}, States: unfinished, Limit: 1000})
	require.NoError(t, err)
	require.Len(t, runs, 10)
	for _, r := range runs {
		require.Equal(t, "v9", r.Version)
		require.Equal(t, store.RunSleeping, r.State)
	}
	x := &explainer{Querier: b.pool}
	_, err = st.RunList(b.ctx, x, store.RunFilter{Versions: []string{"v9"}, States: unfinished, Limit: 100})
	require.ErrorContains(t, err, "explained")
	require.Contains(t, x.plan, "idem_runs_state", "the unfinished states are read from their index:\n%s", x.plan)
}
