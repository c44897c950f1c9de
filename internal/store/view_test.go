package store_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

func TestRunStateCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i, s := range []store.RunState{store.RunDone, store.RunDone, store.RunDone, store.RunFailed, store.RunRunning, store.RunRunning,
		store.RunQueued} {
		b.insertRun(t, run{scope: "s", id: string(rune('a' + i)), state: s})
	}

	t.Run("Exact", func(t *testing.T) {
		counts, err := b.st.RunStateCounts(b.ctx, b.pool, 1000)
		require.NoError(t, err)
		require.Equal(t, []store.StateCount{{State: store.RunRunning, N: 2}, {State: store.RunQueued, N: 1}, {State: store.RunDone, N: 3},
			{State: store.RunFailed, N: 1}}, counts, "in the order of a run's life; states with no runs left out")
	})

	t.Run("PastTheLimit", func(t *testing.T) {
		// The planner's estimate of the table (7 rows once analyzed) is past the limit: states
		// under it are exact, those at it estimated, and done is what is left of the estimate.
		_, err := b.pool.Exec(b.ctx, `ANALYZE idem_runs`)
		require.NoError(t, err)
		counts, err := b.st.RunStateCounts(b.ctx, b.pool, 2)
		require.NoError(t, err)
		byState := map[store.RunState]store.StateCount{}
		for _, c := range counts {
			byState[c.State] = c
		}
		require.Equal(t, store.StateCount{State: store.RunFailed, N: 1}, byState[store.RunFailed])
		require.Equal(t, store.StateCount{State: store.RunQueued, N: 1}, byState[store.RunQueued])
		require.True(t, byState[store.RunRunning].Estimated, "two running runs reach the limit of 2")
		require.GreaterOrEqual(t, byState[store.RunRunning].N, int64(2))
		require.True(t, byState[store.RunDone].Estimated)
		require.Equal(t, int64(7), byState[store.RunDone].N+byState[store.RunRunning].N+2, "done is the table's estimate less the others")
	})

	t.Run("BadLimit", func(t *testing.T) {
		_, err := b.st.RunStateCounts(b.ctx, b.pool, 0)
		require.Error(t, err)
	})
}

func TestRunActivityReads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "r", state: store.RunAwaiting, trace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
	b.insertRun(t, run{scope: "s", id: "bare"})
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO idem_signals (scope, id, name, payload, dedupe_id, consumed_at, consumed_step) VALUES
	('s', 'r', 'go', '1', 'evt-1', now(), 3), ('s', 'r', 'go', '2', NULL, NULL, NULL), ('s', 'r', 'stop', NULL, NULL, NULL, NULL);
INSERT INTO idem_events (scope, id, name, value) VALUES ('s', 'r', 'status', '"waiting"'), ('s', 'r', 'a', '1')`)
	require.NoError(t, err)

	t.Run("Signals", func(t *testing.T) {
		sigs, total, err := b.st.RunSignals(b.ctx, b.pool, "s", "r", 2)
		require.NoError(t, err)
		require.Equal(t, 3, total)
		require.Len(t, sigs, 2, "the newest two, oldest first")
		require.Equal(t, "go", sigs[0].Name)
		require.Equal(t, []byte("2"), sigs[0].Payload)
		require.Nil(t, sigs[0].Consumed)
		require.Equal(t, "stop", sigs[1].Name)

		sigs, total, err = b.st.RunSignals(b.ctx, b.pool, "s", "r", 10)
		require.NoError(t, err)
		require.Equal(t, 3, total)
		require.Equal(t, "evt-1", sigs[0].DedupeID)
		require.NotNil(t, sigs[0].Consumed)
		require.Equal(t, 3, *sigs[0].ConsumedStep)

		sigs, total, err = b.st.RunSignals(b.ctx, b.pool, "s", "bare", 10)
		require.NoError(t, err)
		require.Zero(t, total)
		require.Empty(t, sigs)
	})

	t.Run("Events", func(t *testing.T) {
		evs, err := b.st.RunEvents(b.ctx, b.pool, "s", "r")
		require.NoError(t, err)
		require.Len(t, evs, 2)
		require.Equal(t, "a", evs[0].Name, "by name")
		require.Equal(t, `"waiting"`, string(evs[1].Value))
	})

	t.Run("Trace", func(t *testing.T) {
		tc, ok, err := b.st.RunTraceContext(b.ctx, b.pool, "s", "r")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tc)
		tc, ok, err = b.st.RunTraceContext(b.ctx, b.pool, "s", "bare")
		require.NoError(t, err)
		require.True(t, ok)
		require.Empty(t, tc)
		_, ok, err = b.st.RunTraceContext(b.ctx, b.pool, "s", "none")
		require.NoError(t, err)
		require.False(t, ok)
	})
}
