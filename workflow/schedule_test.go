package workflow_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the tests' time zones, whether or not the machine has zoneinfo

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// The schedule tests go by a clock of their own (workflow.SetScheduleClock), which they move
// tick by tick, so that they never wait for a tick to come.

// testClock is a clock the test moves; engines read it concurrently.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock {
	return &testClock{now: time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// tickRecorder is a workflow that records, in a Tx step, each run it executes.
func tickRecorder() *workflow.Workflow[string, string] {
	return workflow.Define("tick", func(ctx context.Context, in string) (string, error) {
		return steps.Tx(ctx, "record", func(ctx context.Context, t pgx.Tx) (string, error) {
			_, err := t.Exec(ctx, `INSERT INTO effects (run, step, note) VALUES ('tick', 'record', $1)`, in)
			return in, err
		}, nil)
	})
}

// insertOnly gives e a River client that inserts jobs and works none, as cmd/idem's: the runs a
// schedule starts stay unstarted, for the test to count.
func (b *testBundle) insertOnly(t *testing.T, e *workflow.Engine) {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	e.SetClient(client)
}

// schedRuns lists the keys of the runs schedule name started, oldest tick first.
func (b *testBundle) schedRuns(t *testing.T, name string) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT id FROM idem_runs WHERE attributes @> jsonb_build_object('idem.schedule', $1::text) ORDER BY id`, name)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	if len(ids) == 0 {
		return nil
	}
	return ids
}

func tickID(name string, tick time.Time) string {
	return "sched/" + name + "/" + tick.UTC().Format(time.RFC3339Nano)
}

func TestScheduleBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := tickRecorder()
	other := workflow.Define("other", func(ctx context.Context, in string) (string, error) { return in, nil })
	e := b.engine(t, fastConfig(wf))

	for _, c := range []struct {
		name string
		opts *workflow.ScheduleOpts
		want string
	}{
		{"s", nil, "ScheduleOpts.Cron or ScheduleOpts.Every must be set"},
		{"s", &workflow.ScheduleOpts{Cron: "61 * * * *"}, `ScheduleOpts.Cron "61 * * * *" is not a cron expression`},
		{"s", &workflow.ScheduleOpts{Cron: "every day"}, `ScheduleOpts.Cron "every day" is not a cron expression`},
		{"s", &workflow.ScheduleOpts{Cron: "0 0 30 2 *"}, `ScheduleOpts.Cron "0 0 30 2 *" has no tick in the next five years`},
		{"s", &workflow.ScheduleOpts{Cron: "TZ=Europe/Berlin 0 2 * * *"}, "names a time zone; set ScheduleOpts.TimeZone instead"},
		{"s", &workflow.ScheduleOpts{Cron: "@every 5m"}, "is an interval; set ScheduleOpts.Every instead"},
		{"s", &workflow.ScheduleOpts{Cron: "0 2 * * *", TimeZone: "Mars/Olympus"}, `ScheduleOpts.TimeZone "Mars/Olympus" is not a time zone`},
		{"s", &workflow.ScheduleOpts{Cron: "0 2 * * *", TimeZone: "Local"}, `ScheduleOpts.TimeZone "Local" depends on the machine`},
		{"s", &workflow.ScheduleOpts{Cron: "0 2 * * *", Every: time.Hour}, "ScheduleOpts.Cron and ScheduleOpts.Every cannot both be set"},
		{"s", &workflow.ScheduleOpts{Every: 1500 * time.Millisecond}, "ScheduleOpts.Every must be a whole number of seconds, at least one (got 1.5s)"},
		{"s", &workflow.ScheduleOpts{Every: -time.Second}, "ScheduleOpts.Every must be a whole number of seconds"},
		{"s", &workflow.ScheduleOpts{Every: 24 * time.Hour, TimeZone: "Europe/Berlin"}, `ScheduleOpts.TimeZone "Europe/Berlin" has no effect on Every`},
		{"s", &workflow.ScheduleOpts{Every: time.Hour, TimeZone: "Mars/Olympus"}, `ScheduleOpts.TimeZone "Mars/Olympus" has no effect on Every`},
		{"s", &workflow.ScheduleOpts{Every: time.Hour, Overlap: "queue"}, `ScheduleOpts.Overlap "queue" is not an overlap policy`},
		{"s", &workflow.ScheduleOpts{Every: time.Hour, CatchUp: "some"}, `ScheduleOpts.CatchUp "some" is not a catch-up policy`},
		{"s", &workflow.ScheduleOpts{Every: time.Hour, Scope: "a\x00b"}, "ScheduleOpts.Scope is not a key's scope"},
		{"s", &workflow.ScheduleOpts{Every: time.Hour, Attributes: map[string]string{workflow.ScheduleAttribute: "x"}}, `cannot set "idem.schedule"`},
		{"s", &workflow.ScheduleOpts{Every: time.Hour, Attributes: map[string]string{"k": ""}}, `ScheduleOpts.Attributes value of "k" is empty`},
		{"", &workflow.ScheduleOpts{Every: time.Hour}, "a schedule's name must be 1 to 200 bytes (got 0)"},
		{"two words", &workflow.ScheduleOpts{Every: time.Hour}, `schedule name "two words" has byte 0x20 at offset 3`},
	} {
		err := wf.Schedule(b.ctx, e, c.name, "in", c.opts)
		require.ErrorContains(t, err, c.want, "%q %+v", c.name, c.opts)
	}
	err := other.Schedule(b.ctx, e, "s", "in", &workflow.ScheduleOpts{Every: time.Hour})
	require.ErrorContains(t, err, `a schedule of "other" needs the workflow registered with this engine`)
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_schedules`), "a refused schedule leaves nothing")

	_, err = e.ScheduleGet(b.ctx, "missing")
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.ErrorIs(t, e.SchedulePause(b.ctx, "missing", ""), idem.ErrNotFound)
	require.ErrorIs(t, e.ScheduleResume(b.ctx, "missing"), idem.ErrNotFound)
	require.ErrorIs(t, e.ScheduleDelete(b.ctx, "missing"), idem.ErrNotFound)
}

// TestScheduleTwoEngines: two engines, each with its River client working runs and its own
// scheduler loop, and two goroutines each firing at once at every tick, share one schedule
// through 50 ticks: each tick starts one run, executed once.
func TestScheduleTwoEngines(t *testing.T) {
	t.Parallel()
	b := setup(t)
	clock := newTestClock()
	wf := tickRecorder()
	engines := make([]*workflow.Engine, 2)
	for i := range engines {
		engines[i] = b.engine(t, fastConfig(wf))
		workflow.SetScheduleClock(engines[i], clock.Now)
		b.startRiver(t, engines[i])
	}
	require.NoError(t, wf.Schedule(b.ctx, engines[0], "every-second", "tick", &workflow.ScheduleOpts{Every: time.Second,
		Overlap: workflow.OverlapAllow, CatchUp: workflow.CatchUpAll}))

	const ticks = 50
	var want []string
	for range ticks {
		tick := clock.Add(time.Second).Truncate(time.Second)
		want = append(want, tickID("every-second", tick))
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for i := range 4 {
			wg.Go(func() { errs <- workflow.FireSchedules(b.ctx, engines[i%2]) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		// The schedule is past the tick before the clock moves on. A firing returns at once
		// when another engine holds the schedule (SKIP LOCKED), and the engines' own loops
		// fire too, so the holder's COMMIT may come a moment after the four calls return.
		eventually(t, 10*time.Second, "the schedule to move past "+tick.String(), func() bool {
			s, err := engines[1].ScheduleGet(b.ctx, "every-second")
			require.NoError(t, err)
			require.False(t, s.NextTick.UTC().After(tick.Add(time.Second)), "the schedule went past a tick the clock has not reached")
			return s.NextTick.UTC().Equal(tick.Add(time.Second))
		})
	}
	require.Equal(t, want, b.schedRuns(t, "every-second"))
	eventually(t, 30*time.Second, "50 scheduled runs to finish", func() bool {
		return b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'done'`) == ticks
	})
	require.Equal(t, ticks, b.count(t, `SELECT count(*) FROM effects`), "each tick's run executed once")
	require.Equal(t, ticks, b.count(t, `SELECT count(DISTINCT r.id) FROM idem_runs r JOIN idem_steps s USING (scope, id)`))
	s, err := engines[0].ScheduleGet(b.ctx, "every-second")
	require.NoError(t, err)
	require.Equal(t, int64(ticks), s.TicksStarted)
	require.Zero(t, s.TicksSkipped)
}

// TestScheduleCatchUp: ticks missed while no engine fired are started, or not, as the catch-up
// policy says.
func TestScheduleCatchUp(t *testing.T) {
	t.Parallel()

	for _, c := range []struct {
		policy  workflow.CatchUpPolicy
		started []int // which of the 10 missed ticks (1-based) start a run
		skipped int64
	}{
		{workflow.CatchUpLatest, []int{10}, 9},
		{workflow.CatchUpAll, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0},
		{workflow.CatchUpSkip, nil, 10},
	} {
		t.Run(string(c.policy), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			clock := newTestClock()
			wf := tickRecorder()
			e := b.engine(t, fastConfig(wf))
			workflow.SetScheduleClock(e, clock.Now)
			b.insertOnly(t, e)
			require.NoError(t, wf.Schedule(b.ctx, e, "ten-min", "tick", &workflow.ScheduleOpts{Every: 10 * time.Minute,
				Overlap: workflow.OverlapAllow, CatchUp: c.policy}))
			first := clock.Now().Truncate(10 * time.Minute).Add(10 * time.Minute)

			// Down for 10 ticks and 5 minutes: the latest tick is late by more than ScheduleGrace.
			clock.Add(100*time.Minute + 5*time.Minute)
			require.NoError(t, workflow.FireSchedules(b.ctx, e))
			var want []string
			for _, n := range c.started {
				want = append(want, tickID("ten-min", first.Add(time.Duration(n-1)*10*time.Minute)))
			}
			require.Equal(t, want, b.schedRuns(t, "ten-min"))
			s, err := e.ScheduleGet(b.ctx, "ten-min")
			require.NoError(t, err)
			require.Equal(t, c.skipped, s.TicksSkipped)
			require.Equal(t, int64(len(c.started)), s.TicksStarted)
			require.Equal(t, first.Add(100*time.Minute), s.NextTick.UTC(), "the schedule goes on from its next tick")

			// A tick less than ScheduleGrace late starts under every policy.
			clock.Add(10*time.Minute - 5*time.Minute + 30*time.Second)
			require.NoError(t, workflow.FireSchedules(b.ctx, e))
			require.Equal(t, append(want, tickID("ten-min", first.Add(100*time.Minute))), b.schedRuns(t, "ten-min"))
		})
	}
}

// TestScheduleRestart: an engine defines a schedule and goes away; while none runs, five ticks
// pass; a new engine's own loop starts them all (CatchUpAll), and its River client runs them.
func TestScheduleRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	clock := newTestClock()
	wf := tickRecorder()
	first, err := workflow.NewEngine(b.pool, fastConfig(wf))
	require.NoError(t, err)
	workflow.SetScheduleClock(first, clock.Now)
	require.NoError(t, wf.Schedule(b.ctx, first, "minutely", "tick", &workflow.ScheduleOpts{Cron: "* * * * *",
		Overlap: workflow.OverlapAllow, CatchUp: workflow.CatchUpAll}))
	require.NoError(t, first.Close())

	clock.Add(5 * time.Minute)
	second := b.engine(t, fastConfig(wf))
	workflow.SetScheduleClock(second, clock.Now)
	b.startRiver(t, second)
	eventually(t, 30*time.Second, "five missed ticks to run", func() bool {
		return b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'done'`) == 5
	})
	require.Equal(t, 5, b.count(t, `SELECT count(*) FROM effects`))
	start := time.Date(2030, 1, 1, 0, 1, 0, 0, time.UTC)
	var want []string
	for i := range 5 {
		want = append(want, tickID("minutely", start.Add(time.Duration(i)*time.Minute)))
	}
	require.Equal(t, want, b.schedRuns(t, "minutely"))
}

// TestScheduleOverlap: with OverlapSkip a tick is skipped while the run before it is unfinished;
// with OverlapAllow it starts beside it.
func TestScheduleOverlap(t *testing.T) {
	t.Parallel()

	for _, policy := range []workflow.OverlapPolicy{workflow.OverlapSkip, workflow.OverlapAllow} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			clock := newTestClock()
			wf := tickRecorder()
			e := b.engine(t, fastConfig(wf))
			workflow.SetScheduleClock(e, clock.Now)
			b.insertOnly(t, e) // the runs stay unfinished
			require.NoError(t, wf.Schedule(b.ctx, e, "hourly", "tick", &workflow.ScheduleOpts{Every: time.Hour, Overlap: policy}))
			clock.Add(time.Hour)
			require.NoError(t, workflow.FireSchedules(b.ctx, e))
			clock.Add(time.Hour)
			require.NoError(t, workflow.FireSchedules(b.ctx, e))
			s, err := e.ScheduleGet(b.ctx, "hourly")
			require.NoError(t, err)
			runs := b.schedRuns(t, "hourly")
			if policy == workflow.OverlapSkip {
				require.Len(t, runs, 1)
				require.Equal(t, int64(1), s.TicksSkipped)
				require.Equal(t, workflow.RunStateRunning, s.LastRunState)

				// Once the run before is finished, the next tick starts.
				require.NoError(t, e.RunCancel(b.ctx, *s.LastRun, "test"))
				clock.Add(time.Hour)
				require.NoError(t, workflow.FireSchedules(b.ctx, e))
				require.Len(t, b.schedRuns(t, "hourly"), 2)
				return
			}
			require.Len(t, runs, 2)
			require.Zero(t, s.TicksSkipped)
		})
	}
}

// TestScheduleOperations: redefining, pausing, resuming, triggering, backfilling, listing and
// deleting a schedule.
func TestScheduleOperations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	clock := newTestClock()
	wf := tickRecorder()
	e := b.engine(t, fastConfig(wf))
	workflow.SetScheduleClock(e, clock.Now)
	b.insertOnly(t, e)
	opts := &workflow.ScheduleOpts{Cron: "0 2 * * *", TimeZone: "Europe/Berlin", Overlap: workflow.OverlapAllow,
		Attributes: map[string]string{"team": "billing"}}
	require.NoError(t, wf.Schedule(b.ctx, e, "nightly", "in", opts))
	s, err := e.ScheduleGet(b.ctx, "nightly")
	require.NoError(t, err)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	require.Equal(t, time.Date(2030, 1, 1, 2, 0, 0, 0, berlin), s.NextTick.In(berlin), "02:00 in Berlin")
	require.Equal(t, "in", string(s.Input[1:3]))

	// Defined again with the same timing, at a later deploy: the next tick stays. A pause
	// survives it.
	require.NoError(t, e.SchedulePause(b.ctx, "nightly", "INC-1"))
	clock.Add(12 * time.Hour)
	require.NoError(t, wf.Schedule(b.ctx, e, "nightly", "new input", opts))
	s, err = e.ScheduleGet(b.ctx, "nightly")
	require.NoError(t, err)
	require.True(t, s.Paused)
	require.Equal(t, "INC-1", s.PauseNote)
	require.Equal(t, time.Date(2030, 1, 1, 2, 0, 0, 0, berlin), s.NextTick.In(berlin))
	require.Equal(t, `"new input"`, string(s.Input))

	// Paused: no tick starts, however late.
	clock.Add(48 * time.Hour)
	require.NoError(t, workflow.FireSchedules(b.ctx, e))
	require.Empty(t, b.schedRuns(t, "nightly"))

	// Resumed: the ticks of the pause are not caught up; the next one after now is next.
	require.NoError(t, e.ScheduleResume(b.ctx, "nightly"))
	s, err = e.ScheduleGet(b.ctx, "nightly")
	require.NoError(t, err)
	require.False(t, s.Paused)
	require.Empty(t, s.PauseNote)
	require.Equal(t, time.Date(2030, 1, 4, 2, 0, 0, 0, berlin), s.NextTick.In(berlin))
	require.NoError(t, workflow.FireSchedules(b.ctx, e))
	require.Empty(t, b.schedRuns(t, "nightly"))

	// Trigger: a run now, with the schedule's attributes.
	key, err := e.ScheduleTrigger(b.ctx, "nightly")
	require.NoError(t, err)
	require.Equal(t, tickID("nightly", clock.Now()), key.ID)
	require.Equal(t, workflow.DefaultScheduleScope, key.Scope)
	run, err := e.RunGet(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"team": "billing", workflow.ScheduleAttribute: "nightly"}, run.Attributes)
	require.Equal(t, `"new input"`, string(run.Input))

	// Backfill the first two nights; again, and nothing new starts.
	from, to := time.Date(2030, 1, 1, 0, 0, 0, 0, berlin), time.Date(2030, 1, 3, 0, 0, 0, 0, berlin)
	res, err := e.ScheduleBackfill(b.ctx, "nightly", from, to)
	require.NoError(t, err)
	require.Equal(t, []idem.Key{
		{Scope: workflow.DefaultScheduleScope, ID: tickID("nightly", time.Date(2030, 1, 1, 2, 0, 0, 0, berlin))},
		{Scope: workflow.DefaultScheduleScope, ID: tickID("nightly", time.Date(2030, 1, 2, 2, 0, 0, 0, berlin))},
	}, res.Started)
	res, err = e.ScheduleBackfill(b.ctx, "nightly", from, to)
	require.NoError(t, err)
	require.Empty(t, res.Started)
	require.Equal(t, 2, res.Existing)
	require.Len(t, b.schedRuns(t, "nightly"), 3)
	_, err = e.ScheduleBackfill(b.ctx, "nightly", from, clock.Now().Add(time.Hour))
	require.ErrorContains(t, err, "cannot be after now")
	_, err = e.ScheduleBackfill(b.ctx, "nightly", to, from)
	require.ErrorContains(t, err, "must be before its to")
	_, err = e.ScheduleBackfill(b.ctx, "nightly", clock.Now().Add(time.Minute), time.Time{})
	require.ErrorContains(t, err, "must be before now")
	res, err = e.ScheduleBackfill(b.ctx, "nightly", from, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 2, res.Existing, "a zero to is now")
	require.Equal(t, []idem.Key{{Scope: workflow.DefaultScheduleScope, ID: tickID("nightly", time.Date(2030, 1, 3, 2, 0, 0, 0, berlin))}}, res.Started)

	every, err := time.ParseDuration("1s")
	require.NoError(t, err)
	require.NoError(t, wf.Schedule(b.ctx, e, "fast", "in", &workflow.ScheduleOpts{Every: every}))
	_, err = e.ScheduleBackfill(b.ctx, "fast", clock.Now().Add(-time.Hour), clock.Now())
	require.ErrorContains(t, err, "holds more than 1000 ticks")

	// Redefined with other timing: the next tick is the new timing's.
	require.NoError(t, wf.Schedule(b.ctx, e, "fast", "in", &workflow.ScheduleOpts{Every: time.Hour}))
	s, err = e.ScheduleGet(b.ctx, "fast")
	require.NoError(t, err)
	require.Equal(t, clock.Now().Truncate(time.Hour).Add(time.Hour), s.NextTick.UTC())

	list, err := e.ScheduleList(b.ctx, &workflow.ScheduleListParams{Limit: 1})
	require.NoError(t, err)
	require.Len(t, list.Schedules, 1)
	require.Equal(t, "fast", list.Schedules[0].Name)
	require.Equal(t, "fast", list.Next)
	list, err = e.ScheduleList(b.ctx, &workflow.ScheduleListParams{After: list.Next})
	require.NoError(t, err)
	require.Len(t, list.Schedules, 1)
	require.Equal(t, "nightly", list.Schedules[0].Name)
	require.Equal(t, int64(4), list.Schedules[0].TicksStarted)
	require.Empty(t, list.Next)

	require.NoError(t, e.ScheduleDelete(b.ctx, "nightly"))
	_, err = e.ScheduleGet(b.ctx, "nightly")
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.Len(t, b.schedRuns(t, "nightly"), 4, "its runs stay")
}

// TestScheduleLoop: without a test clock, an engine's own loop starts an interval schedule's
// ticks by Postgres's clock and its River client runs them.
func TestScheduleLoop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := tickRecorder()
	e := b.engine(t, fastConfig(wf))
	b.startRiver(t, e)
	require.NoError(t, wf.Schedule(b.ctx, e, "loop", "tick", &workflow.ScheduleOpts{Every: time.Second}))
	eventually(t, 20*time.Second, "two ticks to run", func() bool {
		return b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'done'`) >= 2
	})
	s, err := e.ScheduleGet(b.ctx, "loop")
	require.NoError(t, err)
	require.GreaterOrEqual(t, s.TicksStarted, int64(2))
	require.GreaterOrEqual(t, int64(b.count(t, `SELECT count(*) FROM idem_runs`)), s.TicksStarted, "a tick's run commits with it")
}

// TestScheduleRunsReaped: a schedule's finished runs are reaped like any, attributes and all;
// the schedule stays, and says its last run is gone.
func TestScheduleRunsReaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := tickRecorder()
	e := b.engine(t, fastConfig(wf))
	b.insertOnly(t, e)
	require.NoError(t, wf.Schedule(b.ctx, e, "hourly", "tick", &workflow.ScheduleOpts{Every: time.Hour}))
	key, err := e.ScheduleTrigger(b.ctx, "hourly")
	require.NoError(t, err)
	require.NoError(t, e.RunCancel(b.ctx, key, "test"))
	_, err = b.pool.Exec(b.ctx, `UPDATE idem_runs SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	_, err = workflow.Reap(b.ctx, e)
	require.NoError(t, err)
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys`))
	s, err := e.ScheduleGet(b.ctx, "hourly")
	require.NoError(t, err)
	require.Equal(t, key, *s.LastRun)
	require.Empty(t, s.LastRunState, "reaped")
}

// TestScheduleConcurrency: the concurrency key of a limited workflow's runs is computed from the
// schedule's input when it is defined, and holds for the runs its ticks start: past the limit,
// they queue.
func TestScheduleConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	clock := newTestClock()
	wf := workflow.Define("limited", func(ctx context.Context, account string) (string, error) { return account, nil }).
		WithConcurrency(1, func(account string) string { return account })
	e := b.engine(t, fastConfig(wf))
	workflow.SetScheduleClock(e, clock.Now)
	b.insertOnly(t, e) // the first run holds its slot
	require.NoError(t, wf.Schedule(b.ctx, e, "per-account", "acct-1", &workflow.ScheduleOpts{Every: time.Hour, Overlap: workflow.OverlapAllow}))
	for range 2 {
		clock.Add(time.Hour)
		require.NoError(t, workflow.FireSchedules(b.ctx, e))
	}
	require.Len(t, b.schedRuns(t, "per-account"), 2)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'running' AND concurrency_key = 'acct-1'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'queued' AND concurrency_key = 'acct-1'`))
	s, err := e.ScheduleGet(b.ctx, "per-account")
	require.NoError(t, err)
	require.Equal(t, workflow.RunState("queued"), s.LastRunState)
	require.Equal(t, "acct-1", s.ConcurrencyKey)
}

// TestScheduleFailingDoesNotHoldUpOthers: a schedule whose tick cannot start (its key's start is
// in flight in another transaction) fails its firing, and the schedules due after it fire all the
// same; it fires at the next pass.
func TestScheduleFailingDoesNotHoldUpOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	clock := newTestClock()
	wf := tickRecorder()
	e := b.engine(t, fastConfig(wf))
	workflow.SetScheduleClock(e, clock.Now)
	b.insertOnly(t, e)
	require.NoError(t, wf.Schedule(b.ctx, e, "a", "tick", &workflow.ScheduleOpts{Every: time.Hour}))
	require.NoError(t, wf.Schedule(b.ctx, e, "b", "tick", &workflow.ScheduleOpts{Every: 2 * time.Hour}))
	tick := clock.Add(2*time.Hour - 20*time.Second).Truncate(time.Hour) // 02:00, due for both; a's next tick is earlier
	held := tickID("a", tick)

	other, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(b.ctx) }()
	_, err = other.Exec(b.ctx, `SELECT pg_advisory_xact_lock($1)`, store.LockID("", workflow.DefaultScheduleScope, held))
	require.NoError(t, err)

	err = workflow.FireSchedules(b.ctx, e)
	require.ErrorContains(t, err, `error firing schedule "a"`)
	require.ErrorIs(t, err, idem.ErrInFlight)
	require.Nil(t, b.schedRuns(t, "a"))
	require.Equal(t, []string{tickID("b", tick)}, b.schedRuns(t, "b"), "b fired although a, due before it, failed")

	require.NoError(t, other.Rollback(b.ctx))
	require.NoError(t, workflow.FireSchedules(b.ctx, e))
	require.Equal(t, []string{held}, b.schedRuns(t, "a"))
}
