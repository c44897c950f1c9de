package idemcli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemcli"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
	"github.com/idemkit/idem/workflow/workflowtest"
)

// reminder in two versions: v2 inserts a step after the first sleep, without a patch.
func reminder(v2 bool) *workflow.Workflow[int, int] {
	return workflow.Define("reminder", func(ctx context.Context, n int) (int, error) {
		if err := steps.Sleep(ctx, "first", time.Hour); err != nil {
			return 0, err
		}
		if v2 {
			if _, err := steps.Call(ctx, "audit", func(context.Context, string) (int, error) { return 0, nil }, nil); err != nil {
				return 0, err
			}
		}
		if _, err := steps.Call(ctx, "remind", func(context.Context, string) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		return n, steps.Sleep(ctx, "second", time.Hour)
	})
}

// TestRunsExportAndCheck: the stock command exports runs and says how to check them; a command
// built with the application's workflows finds the runs that would diverge, from the database or
// from an export, and exits 1 for them.
func TestRunsExportAndCheck(t *testing.T) {
	t.Parallel()
	bin := build(t)
	url := idemtest.NewDB(t, nil)
	b := bundle(t, bin, url)
	ctx := b.ctx

	// Three runs of v1: asleep in the second sleep (past the change), asleep in the first, done.
	v1 := reminder(false)
	te := workflowtest.New(t, &workflowtest.Config{Workflows: []workflow.Definition{v1}, DB: b.pool})
	start := func(id string) {
		_, err := v1.Run(ctx, te.Engine(), idem.Key{Scope: "s", ID: id}, 1, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
	}
	start("done")
	require.NoError(t, te.Advance(ctx, time.Hour))
	start("past")
	require.NoError(t, te.Advance(ctx, time.Hour))
	start("early")

	r := b.idem(t, "runs", "check")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "has no workflows to replay runs against")
	require.Contains(t, r.stderr, "idemcli.Main")

	file := filepath.Join(t.TempDir(), "runs.json")
	r = b.idem(t, "runs", "export", "--out", file)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, "exported 3 runs to ")
	f, err := os.Open(file)
	require.NoError(t, err)
	runs, err := workflowtest.ReadExport(f)
	require.NoError(t, f.Close())
	require.NoError(t, err)
	require.Len(t, runs, 3)
	var ex workflowtest.Export
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "export", "--state", "done")), &ex))
	require.Len(t, ex.Runs, 1)
	require.Equal(t, "done", ex.Runs[0].ID)
	require.NotEmpty(t, ex.Runs[0].Steps, "with its history")

	check := func(wf *workflow.Workflow[int, int], args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := idemcli.Main(ctx, append([]string{"runs", "check", "--database-url", url}, args...), &stdout, &stderr,
			&idemcli.Config{Workflows: []workflow.Definition{wf}})
		return code, stdout.String(), stderr.String()
	}
	code, out, stderr := check(reminder(true))
	require.Equal(t, 1, code, stderr)
	require.Regexp(t, `(?m)^SCOPE\s+ID\s+WORKFLOW\s+STEP\s+HISTORY\s+CODE$`, out)
	require.Regexp(t, `(?m)^s\s+past\s+reminder\s+2\s+call "remind"\s+call "audit"$`, out)
	require.NotContains(t, out, "early", "a run before the change resumes fine")
	require.NotContains(t, out, " done ", "finished runs are not checked by default")
	require.Contains(t, out, "replayed 2 runs: 1 would not resume on this code")
	require.Contains(t, stderr, "1 of 2 runs would not resume on this code")

	code, out, _ = check(reminder(true), "--file", file, "--json")
	require.Equal(t, 1, code)
	var report workflowtest.ReplayReport
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.Equal(t, 3, report.Replayed, "an export is checked as it was made")
	require.Len(t, report.Problems, 2, "the done run too")

	code, out, _ = check(reminder(true), "--file", file, "--state", "sleeping", "--workflow", "reminder")
	require.Equal(t, 1, code)
	require.Contains(t, out, "replayed 2 runs: 1 would not resume")

	code, out, stderr = check(reminder(false))
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "replayed 2 runs: 0 would not resume on this code")
}
