package store_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func upsertParams(name string) store.ScheduleUpsertParams {
	return store.ScheduleUpsertParams{Name: name, Workflow: "wf", Scope: "sc", Every: time.Hour, TimeZone: "UTC", Input: []byte(`"in"`),
		Attributes: map[string]string{"team": "a"}, Overlap: "skip", CatchUp: "latest", NextTick: t0.Add(time.Hour)}
}

func TestScheduleStatements(t *testing.T) {
	t.Parallel()

	t.Run("UpsertGetList", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		created, next, err := b.st.ScheduleUpsert(b.ctx, b.pool, upsertParams("a"))
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, t0.Add(time.Hour), next.UTC())

		// Same timing: the stored next tick stays; the rest changes. Paused applies to new ones only.
		p := upsertParams("a")
		p.Input, p.NextTick, p.Paused, p.Overlap = []byte(`"new"`), t0.Add(5*time.Hour), true, "allow"
		created, next, err = b.st.ScheduleUpsert(b.ctx, b.pool, p)
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, t0.Add(time.Hour), next.UTC())
		// Other timing: the new next tick.
		p.Every, p.Cron, p.Concurrency = 0, "0 * * * *", &store.Concurrency{Key: "acct", Limit: 2}
		_, next, err = b.st.ScheduleUpsert(b.ctx, b.pool, p)
		require.NoError(t, err)
		require.Equal(t, t0.Add(5*time.Hour), next.UTC())

		s, ok, err := b.st.ScheduleGet(b.ctx, b.pool, "a")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "0 * * * *", *s.Cron)
		require.Zero(t, s.Every)
		require.Equal(t, `"new"`, string(s.Input))
		require.Equal(t, "allow", s.Overlap)
		require.False(t, s.Paused)
		require.Equal(t, map[string]string{"team": "a"}, s.Attributes)
		require.Equal(t, &store.Concurrency{Key: "acct", Limit: 2}, s.Concurrency)
		require.Nil(t, s.LastTick)
		require.Nil(t, s.LastRunState)

		_, ok, err = b.st.ScheduleGet(b.ctx, b.pool, "missing")
		require.NoError(t, err)
		require.False(t, ok)

		for _, n := range []string{"c", "b"} {
			q := upsertParams(n)
			q.Workflow = "other"
			_, _, err := b.st.ScheduleUpsert(b.ctx, b.pool, q)
			require.NoError(t, err)
		}
		names := func(after string, workflows []string, limit int) []string {
			list, err := b.st.ScheduleList(b.ctx, b.pool, after, workflows, limit)
			require.NoError(t, err)
			var out []string
			for _, s := range list {
				out = append(out, s.Name)
			}
			return out
		}
		require.Equal(t, []string{"a", "b", "c"}, names("", nil, 10))
		require.Equal(t, []string{"b"}, names("a", nil, 1))
		require.Equal(t, []string{"b", "c"}, names("", []string{"other"}, 10))
	})

	t.Run("PauseResumeDelete", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, _, err := b.st.ScheduleUpsert(b.ctx, b.pool, upsertParams("a"))
		require.NoError(t, err)
		ok, err := b.st.ScheduleResume(b.ctx, b.pool, "a", t0)
		require.NoError(t, err)
		require.False(t, ok, "not paused")
		ok, err = b.st.SchedulePause(b.ctx, b.pool, "a", "why")
		require.NoError(t, err)
		require.True(t, ok)
		s, _, err := b.st.ScheduleGet(b.ctx, b.pool, "a")
		require.NoError(t, err)
		require.True(t, s.Paused)
		require.Equal(t, "why", s.PauseNote)
		_, _, ok, err = b.st.ScheduleClaim(b.ctx, b.pool, ptr(t0.Add(24*time.Hour)), nil)
		require.NoError(t, err)
		require.False(t, ok, "a paused schedule is never due")
		_, ok, err = b.st.ScheduleNextDue(b.ctx, b.pool, &t0)
		require.NoError(t, err)
		require.False(t, ok)

		ok, err = b.st.ScheduleResume(b.ctx, b.pool, "a", t0.Add(3*time.Hour))
		require.NoError(t, err)
		require.True(t, ok)
		s, _, err = b.st.ScheduleGet(b.ctx, b.pool, "a")
		require.NoError(t, err)
		require.False(t, s.Paused)
		require.Empty(t, s.PauseNote)
		require.Equal(t, t0.Add(3*time.Hour), s.NextTick.UTC())
		d, ok, err := b.st.ScheduleNextDue(b.ctx, b.pool, &t0)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, 3*time.Hour, d)

		ok, err = b.st.SchedulePause(b.ctx, b.pool, "missing", "")
		require.NoError(t, err)
		require.False(t, ok)
		ok, err = b.st.ScheduleDelete(b.ctx, b.pool, "a")
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = b.st.ScheduleDelete(b.ctx, b.pool, "a")
		require.NoError(t, err)
		require.False(t, ok)
	})

	t.Run("ClaimSkipsLockedAndAdvance", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, n := range []string{"a", "b"} {
			_, _, err := b.st.ScheduleUpsert(b.ctx, b.pool, upsertParams(n))
			require.NoError(t, err)
		}
		now := t0.Add(90 * time.Minute)
		_, _, ok, err := b.st.ScheduleClaim(b.ctx, b.pool, ptr(t0), nil)
		require.NoError(t, err)
		require.False(t, ok, "nothing is due before its next tick")

		one := b.begin(t)
		s1, at, ok, err := b.st.ScheduleClaim(b.ctx, one, &now, nil)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, now, at.UTC())
		// The one passed over (it failed to fire) is not claimed; the other is not due.
		_, _, ok, err = b.st.ScheduleClaim(b.ctx, b.pool, &now, []string{"a", "b", s1.Name})
		require.NoError(t, err)
		require.False(t, ok)
		two := b.begin(t)
		s2, _, ok, err := b.st.ScheduleClaim(b.ctx, two, &now, []string{"z"})
		require.NoError(t, err)
		require.True(t, ok)
		require.NotEqual(t, s1.Name, s2.Name, "the second claim skips the schedule the first holds")
		three := b.begin(t)
		_, _, ok, err = b.st.ScheduleClaim(b.ctx, three, &now, nil)
		require.NoError(t, err)
		require.False(t, ok, "both due schedules are held")
		require.NoError(t, three.Rollback(b.ctx))

		// A run under the tick's key, unfinished, is the last run's state.
		_, err = b.pool.Exec(b.ctx, `INSERT INTO idem_runs (scope, id, workflow, state) VALUES ('sc', 'sched/x', 'wf', 'running')`)
		require.NoError(t, err)
		next, last := t0.Add(2*time.Hour), t0.Add(time.Hour)
		require.NoError(t, b.st.ScheduleAdvance(b.ctx, one, store.ScheduleAdvanceParams{Name: s1.Name, NextTick: &next, LastTick: &last,
			LastRunID: "sched/x", Started: 1, Skipped: 2}))
		require.NoError(t, one.Commit(b.ctx))
		// An older tick (a backfill) leaves the last one as it is.
		older := t0
		require.NoError(t, b.st.ScheduleAdvance(b.ctx, b.pool, store.ScheduleAdvanceParams{Name: s1.Name, LastTick: &older, LastRunID: "old", Started: 1}))
		s, _, err := b.st.ScheduleGet(b.ctx, b.pool, s1.Name)
		require.NoError(t, err)
		require.Equal(t, next, s.NextTick.UTC())
		require.Equal(t, last, s.LastTick.UTC())
		require.Equal(t, "sched/x", s.LastRunID)
		require.Equal(t, store.RunRunning, *s.LastRunState)
		require.Equal(t, int64(2), s.TicksStarted)
		require.Equal(t, int64(2), s.TicksSkipped)

		// Lock waits for nobody here, and reads the schedule with the time.
		s, at, ok, err = b.st.ScheduleLock(b.ctx, b.pool, s1.Name, nil)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, s1.Name, s.Name)
		require.WithinDuration(t, time.Now(), at, time.Minute, "Postgres's clock when none is given")
		_, _, ok, err = b.st.ScheduleLock(b.ctx, b.pool, "missing", nil)
		require.NoError(t, err)
		require.False(t, ok)
		got, err := b.st.ScheduleNow(b.ctx, b.pool, &t0)
		require.NoError(t, err)
		require.Equal(t, t0, got.UTC())
	})
}

func TestRunAttributes(t *testing.T) {
	t.Parallel()

	attrs := func(t *testing.T, b *testBundle, id string) map[string]string {
		t.Helper()
		var m map[string]string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT attributes FROM idem_runs WHERE id = $1`, id).Scan(&m))
		return m
	}

	t.Run("StartEnqueueSet", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tok := newToken()
		s := b.st.RunStart(store.RunStartParams{Scope: "s", ID: "k", Workflow: "wf", Input: []byte(`1`), Token: tok, Owner: "o",
			Lease: time.Minute, Attributes: map[string]string{"a": "1", "b": "2"}})
		row, err := store.ScanRunStart(b.pool.QueryRow(b.ctx, s.SQL, s.Args...))
		require.NoError(t, err)
		require.True(t, row.Started)
		require.Equal(t, map[string]string{"a": "1", "b": "2"}, attrs(t, b, "k"))

		_, ok, err := b.st.RunEnqueue(b.ctx, b.pool, store.RunEnqueueParams{Scope: "s", ID: "none", Workflow: "wf", Input: []byte(`1`)})
		require.NoError(t, err)
		require.True(t, ok)
		require.Nil(t, attrs(t, b, "none"), "no attributes store NULL, outside the index")

		set := func(p store.RunSetAttributesParams) store.RunSetAttributesResult {
			r, err := b.st.RunSetAttributes(b.ctx, b.pool, p)
			require.NoError(t, err)
			return r
		}
		lease := store.LeaseParams{Scope: "s", ID: "k", Token: tok}
		r := set(store.RunSetAttributesParams{LeaseParams: lease, Set: map[string]string{"b": "3", "c": "4"}, Remove: []string{"a"}, Max: 3})
		require.Equal(t, store.RunSetAttributesResult{Set: true, Count: 2}, r)
		require.Equal(t, map[string]string{"b": "3", "c": "4"}, attrs(t, b, "k"))
		r = set(store.RunSetAttributesParams{LeaseParams: lease, Set: map[string]string{"d": "5", "e": "6"}, Max: 3})
		require.Equal(t, store.RunSetAttributesResult{Set: false, Count: 4}, r, "over Max: nothing written")
		require.Equal(t, map[string]string{"b": "3", "c": "4"}, attrs(t, b, "k"))
		r = set(store.RunSetAttributesParams{LeaseParams: lease, Remove: []string{"b", "c"}, Max: 3})
		require.True(t, r.Set)
		require.Nil(t, attrs(t, b, "k"), "none left: NULL again")
		r = set(store.RunSetAttributesParams{LeaseParams: store.LeaseParams{Scope: "s", ID: "k", Token: newToken()}, Set: map[string]string{"x": "y"}, Max: 3})
		require.True(t, r.Fenced, "another token is fenced out")
	})

	t.Run("ListFilterUsesIndex", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// 20000 runs, each customer's 10 among them: a filter that the index answers, where
		// walking idem_runs_created newest first would read half the table.
		_, err := b.pool.Exec(b.ctx, `INSERT INTO idem_runs (scope, id, workflow, state, created_at, attributes)
SELECT 's', 'r' || i, 'wf', 'done', now() - i * interval '1 second',
	jsonb_build_object('customer', 'c-' || (i % 2000), 'region', CASE WHEN i % 2 = 0 THEN 'eu' ELSE 'us' END)
FROM generate_series(1, 20000) AS i`)
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `ANALYZE idem_runs`)
		require.NoError(t, err)

		f := store.RunFilter{Attributes: map[string]string{"customer": "c-7"}, Limit: 101}
		sql, args := b.st.ListRunsSQL(f)
		rows, err := b.pool.Query(b.ctx, "EXPLAIN "+sql, args...)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		plan := ""
		for _, l := range lines {
			plan += l + "\n"
		}
		require.Contains(t, plan, "idem_runs_attributes", "the attribute filter must use its index:\n%s", plan)

		runs, err := b.st.RunList(b.ctx, b.pool, f)
		require.NoError(t, err)
		require.Len(t, runs, 10)
		for i, r := range runs {
			require.Equal(t, "c-7", r.Attributes["customer"])
			if i > 0 {
				require.True(t, r.Created.Before(runs[i-1].Created), "newest first")
			}
		}
		n, err := strconv.Atoi(runs[0].ID[1:])
		require.NoError(t, err)
		require.Equal(t, 7, n%2000)
	})
}
