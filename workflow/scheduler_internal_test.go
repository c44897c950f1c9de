package workflow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPlanTicks holds the catch-up policies to which ticks a firing starts, including a schedule
// so far behind that the walk over its missed ticks jumps to the latest.
func TestPlanTicks(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	minute := everyTiming{us: time.Minute.Microseconds()}
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }

	start, skipped, next := planTicks(minute, at(1), at(1), CatchUpLatest)
	require.Equal(t, []time.Time{at(1)}, start, "a tick due now")
	require.Zero(t, skipped)
	require.Equal(t, at(2), next)

	start, skipped, next = planTicks(minute, at(1), at(5).Add(30*time.Second), CatchUpLatest)
	require.Equal(t, []time.Time{at(5)}, start)
	require.Equal(t, 4, skipped)
	require.Equal(t, at(6), next)

	start, skipped, next = planTicks(minute, at(1), at(5).Add(30*time.Second), CatchUpSkip)
	require.Equal(t, []time.Time{at(5)}, start, "30s late is within ScheduleGrace")
	require.Equal(t, 4, skipped)
	require.Equal(t, at(6), next)

	start, skipped, _ = planTicks(minute, at(1), at(5).Add(2*time.Minute-time.Second), CatchUpSkip)
	require.Equal(t, []time.Time{at(6)}, start)
	require.Equal(t, 5, skipped)

	tenMinutes := everyTiming{us: (10 * time.Minute).Microseconds()}
	start, skipped, next = planTicks(tenMinutes, at(10), at(30).Add(ScheduleGrace+time.Second), CatchUpSkip)
	require.Empty(t, start, "the latest tick is more than ScheduleGrace late")
	require.Equal(t, 3, skipped)
	require.Equal(t, at(40), next)

	start, skipped, next = planTicks(minute, at(1), at(250), CatchUpAll)
	require.Len(t, start, maxTicksPerFiring)
	require.Equal(t, at(1), start[0])
	require.Equal(t, at(100), start[99])
	require.Zero(t, skipped)
	require.Equal(t, at(101), next, "the rest is due still, for the next firing")

	// Every second, down for a year: the walk stops at maxTickWalk and jumps to the latest.
	second := everyTiming{us: time.Second.Microseconds()}
	now := t0.AddDate(1, 0, 0).Add(500 * time.Millisecond)
	start, skipped, next = planTicks(second, t0.Add(time.Second), now, CatchUpLatest)
	require.Equal(t, []time.Time{t0.AddDate(1, 0, 0)}, start)
	require.Equal(t, maxTickWalk, skipped)
	require.Equal(t, t0.AddDate(1, 0, 0).Add(time.Second), next)

	// A cron expression, far behind, in a time zone.
	tm, err := parseTiming("", "*/2 * * * * *", 0, "Asia/Tokyo")
	require.NoError(t, err)
	start, _, next = planTicks(tm, t0, now, CatchUpLatest)
	require.Equal(t, []time.Time{t0.AddDate(1, 0, 0)}, start)
	require.Equal(t, t0.AddDate(1, 0, 0).Add(2*time.Second), next.UTC())

	// No tick ever: nothing to start, and no next tick.
	never, err := parseTiming("", "0 0 30 2 *", 0, "")
	require.NoError(t, err)
	require.True(t, never.next(t0).IsZero())
	start, _, next = planTicks(never, t0, t0, CatchUpAll)
	require.Equal(t, []time.Time{t0}, start)
	require.True(t, next.IsZero())
}

// TestEveryTiming: interval ticks fall on whole multiples of the interval since the Unix epoch,
// before it too.
func TestEveryTiming(t *testing.T) {
	t.Parallel()
	e := everyTiming{us: (7 * time.Second).Microseconds()}
	require.Equal(t, time.Unix(7, 0).UTC(), e.next(time.Unix(0, 0).UTC()))
	require.Equal(t, time.Unix(14, 0).UTC(), e.next(time.Unix(7, 0).UTC()))
	require.Equal(t, time.Unix(0, 0).UTC(), e.next(time.Unix(-3, 0).UTC()))
	require.Equal(t, time.Unix(-7, 0).UTC(), e.next(time.Unix(-8, 0).UTC()))
	require.Equal(t, time.Unix(-7, 0).UTC(), e.next(time.Unix(-14, 0).UTC()))
}
