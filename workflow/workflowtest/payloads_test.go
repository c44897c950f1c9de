package workflowtest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
	"github.com/idemkit/idem/workflow/workflowtest"
)

// TestLargePayloadsInVirtualTime: under the virtual clock, a run's large payloads go by the
// day of the created_at it has (virtual), however far the clock moves while it sleeps, and read
// back the same.
func TestLargePayloadsInVirtualTime(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("b", 4<<10)
	wf := workflow.Define("bulky-virtual", func(ctx context.Context, _ int) (string, error) {
		got, err := steps.Call(ctx, "fetch", func(ctx context.Context, key string) (string, error) { return "", nil }, nil)
		if err != nil {
			return "", err
		}
		if err := steps.Sleep(ctx, "cool-off", 30*day); err != nil {
			return "", err
		}
		if err := steps.SetEvent(ctx, "ev", got); err != nil {
			return "", err
		}
		sig, err := steps.Await[string](ctx, "confirm", "confirmed", 0)
		if err != nil {
			return "", err
		}
		return got[:10] + sig[:10], nil
	})
	te := workflowtest.New(t, &workflowtest.Config{
		Workflows: []workflow.Definition{wf},
		Fakes:     map[string]workflowtest.Fake{"fetch": func(context.Context, string) (any, error) { return big, nil }},
	})
	ctx := context.Background()
	key := idem.Key{Scope: "s", ID: "k"}
	_, err := wf.Run(ctx, te.Engine(), key, 1, nil)
	require.ErrorIs(t, err, idem.ErrInFlight)
	require.NoError(t, te.Advance(ctx, 31*day))
	_, err = te.Signal(ctx, key, "confirmed", strings.Repeat("s", 2<<10), nil)
	require.NoError(t, err)
	out, err := wf.Get(ctx, te.Engine(), key)
	require.NoError(t, err)
	require.Equal(t, "bbbbbbbbbbssssssssss", out)
	ev, err := workflow.GetEvent[string](ctx, te.Engine(), key, "ev", 0)
	require.NoError(t, err)
	require.Equal(t, big, ev)
	history, err := te.History(ctx, key)
	require.NoError(t, err)
	require.Len(t, history, 4)
	require.Equal(t, `"`+big+`"`, string(history[0].Output))

	// Every large payload is in the partition of the run's (virtual) start day when it has
	// one, or inline; none went by the clock's day when it was written.
	var stray, large int
	require.NoError(t, te.DB().QueryRow(ctx, `SELECT
	(SELECT count(*) FROM idem_steps s JOIN idem_runs r USING (scope, id) WHERE s.output_day <> (r.created_at AT TIME ZONE 'UTC')::date)
	+ (SELECT count(*) FROM idem_events e JOIN idem_runs r USING (scope, id) WHERE e.value_day <> (r.created_at AT TIME ZONE 'UTC')::date)
	+ (SELECT count(*) FROM idem_signals g JOIN idem_runs r USING (scope, id) WHERE g.payload_day <> (r.created_at AT TIME ZONE 'UTC')::date),
	(SELECT count(*) FROM idem_run_payloads)`).Scan(&stray, &large))
	require.Zero(t, stray)
	// The virtual clock starts at the database's time, whose day has its partition: the
	// fetch's output, the event step's output and value, the signal and the await's output.
	require.Equal(t, 5, large)
}
