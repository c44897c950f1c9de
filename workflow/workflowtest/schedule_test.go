package workflowtest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // the test's time zone, whether or not the machine has zoneinfo

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
	"github.com/idemkit/idem/workflow/workflowtest"
)

// A digest that takes 90 minutes: sent, then a wait before it counts as done.
var digest = workflow.Define("digest", func(ctx context.Context, list string) (string, error) {
	id, err := steps.Call(ctx, "send", func(ctx context.Context, key string) (string, error) {
		panic("the real mailer is not called in tests")
	}, nil)
	if err != nil {
		return "", err
	}
	return id, steps.Sleep(ctx, "settle", 90*time.Minute)
})

// A report that is done at once.
var report = workflow.Define("report", func(ctx context.Context, name string) (string, error) {
	return steps.Call(ctx, "render", func(ctx context.Context, key string) (string, error) {
		panic("the real renderer is not called in tests")
	}, nil)
})

// The test engine fires schedules by its virtual clock: a week of ticks in one call, with the
// overlap policy, time zones and the runs' own sleeps all going by that clock.
func TestSchedulesGoByTheVirtualClock(t *testing.T) {
	ctx := context.Background()
	var sent, rendered atomic.Int32
	var renderedAt []time.Time
	var te *workflowtest.Engine
	te = workflowtest.New(t, &workflowtest.Config{
		Workflows: []workflow.Definition{digest, report},
		Fakes: map[string]workflowtest.Fake{
			"send": func(ctx context.Context, key string) (any, error) { return "m" + string(rune('0'+sent.Add(1))), nil },
			"render": func(ctx context.Context, key string) (any, error) {
				rendered.Add(1)
				renderedAt = append(renderedAt, te.Now())
				return "r", nil
			},
		},
	})
	e := te.Engine()
	start := te.Now()

	t.Run("Overlap", func(t *testing.T) {
		// Hourly, each run taking 90 minutes, skipping a tick while the run before is unfinished:
		// of six ticks, the first, third and fifth start runs.
		require.NoError(t, digest.Schedule(ctx, e, "hourly-digest", "all", &workflow.ScheduleOpts{Every: time.Hour}))
		require.Zero(t, sent.Load(), "no tick is due before the clock moves")
		require.NoError(t, te.Advance(ctx, 6*time.Hour))
		s, err := e.ScheduleGet(ctx, "hourly-digest")
		require.NoError(t, err)
		require.EqualValues(t, 3, s.TicksStarted)
		require.EqualValues(t, 3, s.TicksSkipped)
		require.EqualValues(t, 3, sent.Load())
		require.Equal(t, start.Add(6*time.Hour).UnixMicro(), te.Now().UnixMicro(), "the clock ends where it was moved to")
		require.True(t, s.NextTick.After(te.Now()), "next tick %s is after the clock's %s", s.NextTick, te.Now())
		require.NoError(t, e.SchedulePause(ctx, "hourly-digest", "done with it"))
	})

	t.Run("TimeZone", func(t *testing.T) {
		// 09:00 on weekdays in Berlin: five runs in a week, each when the clock showed 09:00 there.
		berlin, err := time.LoadLocation("Europe/Berlin")
		require.NoError(t, err)
		require.NoError(t, report.Schedule(ctx, e, "weekday-report", "sales", &workflow.ScheduleOpts{Cron: "0 9 * * MON-FRI", TimeZone: "Europe/Berlin"}))
		before := rendered.Load()
		require.NoError(t, te.Advance(ctx, 7*day))
		require.EqualValues(t, 5, rendered.Load()-before)
		for _, at := range renderedAt {
			local := at.In(berlin)
			require.Equal(t, 9, local.Hour(), "rendered at %s", local)
			require.Zero(t, local.Minute())
			require.NotContains(t, []time.Weekday{time.Saturday, time.Sunday}, local.Weekday())
		}
	})

	t.Run("Paused", func(t *testing.T) {
		// The paused schedule does not fire however far the clock moves; resumed, it catches up
		// with the latest missed tick only (CatchUpLatest).
		before := sent.Load()
		require.NoError(t, te.Advance(ctx, 3*day))
		require.Equal(t, before, sent.Load())
		require.NoError(t, e.ScheduleResume(ctx, "hourly-digest"))
		require.NoError(t, te.RunDue(ctx))
		require.Equal(t, before, sent.Load(), "resuming moves the next tick on from now")
		require.NoError(t, te.Advance(ctx, time.Hour))
		require.Equal(t, before+1, sent.Load())
	})
}
