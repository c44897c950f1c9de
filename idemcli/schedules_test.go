package idemcli_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/workflow"
)

// TestCLISchedules: a schedule the application defined, read and steered by the CLI, which
// knows no workflow; the runs it starts carry the schedule's attribute, which runs list filters.
func TestCLISchedules(t *testing.T) {
	t.Parallel()
	bin := build(t)
	b := bundle(t, bin, idemtest.NewDB(t, &idemtest.Opts{River: true}))
	wf := workflow.Define("settle", func(ctx context.Context, day string) (string, error) { return day, nil })
	e, err := workflow.NewEngine(b.pool, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	require.NoError(t, wf.Schedule(b.ctx, e, "hourly-settle", "today", &workflow.ScheduleOpts{Every: time.Hour, Overlap: workflow.OverlapAllow,
		Attributes: map[string]string{"team": "billing"}}))

	out := b.ok(t, "schedules", "list")
	require.Regexp(t, `(?m)^NAME\s+WORKFLOW\s+WHEN\s+STATE\s+NEXT TICK\s+LAST RUN\s+STARTED\s+SKIPPED$`, out)
	require.Regexp(t, `(?m)^hourly-settle\s+settle\s+every 1h0m0s\s+active\s+\S+\s+-\s+0\s+0$`, out)

	require.Contains(t, b.ok(t, "schedules", "pause", "hourly-settle", "--note", "INC-7"), `paused schedule "hourly-settle"`)
	out = b.ok(t, "schedules", "show", "hourly-settle")
	require.Regexp(t, `(?m)^state\s+paused$`, out)
	require.Regexp(t, `(?m)^pause note\s+INC-7$`, out)
	require.Regexp(t, `(?m)^attribute\s+team=billing$`, out)
	require.Contains(t, b.ok(t, "schedules", "resume", "hourly-settle"), "resumed")

	out = b.ok(t, "schedules", "trigger", "hourly-settle")
	require.Regexp(t, `started run "sched/hourly-settle/\S+" in scope "idem.schedule"`, out)
	var page workflow.RunListResult
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "list", "--attr", "idem.schedule=hourly-settle", "--attr", "team=billing", "--json")), &page))
	require.Len(t, page.Runs, 1)
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "list", "--attr", "team=other", "--json")), &page))
	require.Empty(t, page.Runs)
	out = b.ok(t, "runs", "show", "idem.schedule", onlyRunID(t, b))
	require.Regexp(t, `(?m)^attribute\s+idem.schedule=hourly-settle$`, out)

	// The last three whole hours, twice: the second starts nothing.
	out = b.ok(t, "schedules", "backfill", "hourly-settle", "--from", "3h")
	require.Contains(t, out, "3 started, 0 had run already")
	var res workflow.ScheduleBackfillResult
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "schedules", "backfill", "hourly-settle", "--from", "3h", "--json")), &res))
	require.Empty(t, res.Started)
	require.Equal(t, 3, res.Existing)

	var s workflow.ScheduleRow
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "schedules", "show", "hourly-settle", "--json")), &s))
	require.Equal(t, int64(4), s.TicksStarted)
	require.Equal(t, workflow.RunStateRunning, s.LastRunState, "the triggered run, the latest tick, waits for a worker")

	require.Contains(t, b.ok(t, "schedules", "delete", "hourly-settle"), "deleted")
	r := b.idem(t, "schedules", "show", "hourly-settle")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `no schedule is named "hourly-settle"`)
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM idem_runs`), "its runs stay")

	for _, args := range [][]string{{"schedules", "show"}, {"schedules", "backfill", "x"}, {"schedules", "backfill", "x", "--from", "yesterday"},
		{"runs", "list", "--attr", "no-value"}, {"runs", "list", "--attr", "k="}, {"schedules", "list", "--limit", "0"}, {"schedules", "bogus"}} {
		r := b.idem(t, args...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
		require.NotEmpty(t, r.stderr)
	}
	r = b.idem(t, "schedules", "pause", "has space")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "only printable ASCII")
	require.Contains(t, b.ok(t, "schedules", "--help"), "schedules backfill NAME")
}

// onlyRunID is the ID of the one run in the database.
func onlyRunID(t *testing.T, b *testBundle) string {
	t.Helper()
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id FROM idem_runs LIMIT 1`).Scan(&id))
	return id
}
