package workflow_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/workflow"
)

// TestScheduleDST: a daily schedule at a fixed time in a zone with summer time starts one run on
// each day, the days the clocks change too. On the spring day its 02:00 does not exist and it
// ticks when the clock has jumped (03:00 CEST, an hour later by the wall clock, as the hour is
// skipped); on the autumn day 02:00 happens twice and it ticks at the first only. A schedule that
// runs every hour keeps ticking every hour of real time through both changes.
func TestScheduleDST(t *testing.T) {
	t.Parallel()
	b := setup(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	clock := &testClock{now: time.Date(2030, 3, 30, 12, 0, 0, 0, time.UTC)}
	wf := tickRecorder()
	e := b.engine(t, fastConfig(wf))
	workflow.SetScheduleClock(e, clock.Now)
	b.insertOnly(t, e)
	opts := func(cron string) *workflow.ScheduleOpts {
		return &workflow.ScheduleOpts{Cron: cron, TimeZone: "Europe/Berlin", Overlap: workflow.OverlapAllow, CatchUp: workflow.CatchUpAll}
	}
	// walk moves the clock a quarter of an hour at a time for two days, firing at each step.
	walk := func() {
		for range 2 * 24 * 4 {
			clock.Add(15 * time.Minute)
			require.NoError(t, workflow.FireSchedules(b.ctx, e))
		}
	}

	// Spring: the clocks go from 02:00 CET to 03:00 CEST on 31 March 2030.
	require.NoError(t, wf.Schedule(b.ctx, e, "spring", "in", opts("0 2 * * *")))
	require.NoError(t, wf.Schedule(b.ctx, e, "spring-hourly", "in", opts("0 * * * *")))
	walk()
	require.Equal(t, []string{
		tickID("spring", time.Date(2030, 3, 31, 3, 0, 0, 0, berlin)), // 02:00 does not exist that day
		tickID("spring", time.Date(2030, 4, 1, 2, 0, 0, 0, berlin)),
	}, b.schedRuns(t, "spring"), "one run a day")
	require.Len(t, b.schedRuns(t, "spring-hourly"), 48, "one run an hour of real time")

	// Autumn: the clocks go from 03:00 CEST back to 02:00 CET on 27 October 2030.
	require.NoError(t, e.ScheduleDelete(b.ctx, "spring"))
	require.NoError(t, e.ScheduleDelete(b.ctx, "spring-hourly"))
	clock.mu.Lock()
	clock.now = time.Date(2030, 10, 26, 12, 0, 0, 0, time.UTC)
	clock.mu.Unlock()
	require.NoError(t, wf.Schedule(b.ctx, e, "autumn", "in", opts("30 2 * * *")))
	require.NoError(t, wf.Schedule(b.ctx, e, "autumn-hourly", "0 * * * *", opts("0 * * * *")))
	walk()
	first := time.Date(2030, 10, 27, 0, 30, 0, 0, time.UTC) // 02:30 CEST, the first 02:30 of the day
	require.Equal(t, "02:30 CEST", first.In(berlin).Format("15:04 MST"))
	require.Equal(t, []string{
		tickID("autumn", first),
		tickID("autumn", time.Date(2030, 10, 28, 2, 30, 0, 0, berlin)),
	}, b.schedRuns(t, "autumn"), "one run a day, not one for each 02:30")
	require.Len(t, b.schedRuns(t, "autumn-hourly"), 48, "one run an hour of real time")
}
