package workflowtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
	"github.com/idemkit/idem/workflow/workflowtest"
)

// A workflow for the replay tests is a chain of steps, written as "kind:name": call, tx, sleep
// (an hour), patch (an `if Patched(name)` around the next step) and deprecated.
var executed atomic.Int64 // step functions that ran, in every chain

func chain(name string, spec ...string) *workflow.Workflow[int, int] {
	return workflow.Define(name, func(ctx context.Context, in int) (int, error) {
		skip := false
		for _, s := range spec {
			kind, step, _ := strings.Cut(s, ":")
			if skip {
				skip = false
				continue
			}
			var err error
			switch kind {
			case "call":
				_, err = steps.Call(ctx, step, func(context.Context, string) (int, error) { executed.Add(1); return 1, nil }, nil)
			case "tx":
				_, err = steps.Tx(ctx, step, func(context.Context, pgx.Tx) (int, error) { executed.Add(1); return 1, nil }, nil)
			case "sleep":
				err = steps.Sleep(ctx, step, time.Hour)
			case "patch":
				var ok bool
				ok, err = workflow.Patched(ctx, step)
				skip = !ok
			case "deprecated":
				err = workflow.Deprecated(ctx, step)
			default:
				panic("unknown kind " + kind)
			}
			if err != nil {
				return 0, err
			}
		}
		return in, nil
	})
}

// v1 is the code the runs were started on; v2 the code replayed against, with one change of
// each kind (legacy is gone from v2).
var (
	v1 = []*workflow.Workflow[int, int]{
		chain("order", "call:reserve", "sleep:s1", "call:charge", "sleep:s2", "call:ship"),
		chain("refund", "call:lookup", "sleep:s1", "call:refund", "sleep:s2", "call:notify"),
		chain("signup", "call:create", "sleep:s1", "call:welcome", "sleep:s2", "call:survey"),
		chain("report", "call:gather", "sleep:s1", "tx:store", "sleep:s2", "call:send"),
		chain("promo", "call:a", "patch:bonus", "call:bonus", "sleep:s1", "call:c", "sleep:s2", "call:d"),
		chain("billing", "call:a", "sleep:s1", "call:b", "sleep:s2", "call:c"),
		chain("legacy", "call:a", "sleep:s1", "call:b", "sleep:s2", "call:c"),
	}
	v2 = []*workflow.Workflow[int, int]{
		chain("order", "call:reserve", "sleep:s1", "call:fraud", "call:charge", "sleep:s2", "call:ship"),    // a step inserted
		chain("refund", "call:lookup", "sleep:s1", "call:refund-v2", "sleep:s2", "call:notify"),             // a step renamed
		chain("signup", "call:create", "sleep:s1", "call:welcome", "sleep:s2"),                              // the last step removed
		chain("report", "call:gather", "sleep:s1", "call:store", "sleep:s2", "call:send"),                   // a step's kind changed
		chain("promo", "call:a", "call:bonus", "sleep:s1", "call:c", "sleep:s2", "call:d"),                  // a patch removed too early
		chain("billing", "call:a", "patch:audit", "call:audit", "sleep:s1", "call:b", "sleep:s2", "call:c"), // a step inserted behind a patch
	}
)

func definitions(wfs []*workflow.Workflow[int, int]) []workflow.Definition {
	defs := make([]workflow.Definition, len(wfs))
	for i, wf := range wfs {
		defs[i] = wf
	}
	return defs
}

// storedRuns runs 100 runs of v1 on a test engine to three points: done, asleep in s2, asleep
// in s1 (5 of each per workflow; legacy has 5 done and 5 asleep in s1), and returns the engine.
func storedRuns(t *testing.T, ctx context.Context) *workflowtest.Engine {
	te := workflowtest.New(t, &workflowtest.Config{Workflows: definitions(v1)})
	start := func(group string, n int, wfs []*workflow.Workflow[int, int]) {
		for _, wf := range wfs {
			for i := range n {
				_, err := wf.Run(ctx, te.Engine(), idem.Key{Scope: wf.Name(), ID: fmt.Sprintf("%s-%d", group, i)}, i, nil)
				require.ErrorIs(t, err, idem.ErrInFlight)
			}
		}
	}
	start("done", 5, v1)
	require.NoError(t, te.Advance(ctx, 2*time.Hour))
	start("mid", 5, v1[:6])
	require.NoError(t, te.Advance(ctx, time.Hour))
	start("early", 5, v1[:6])
	start("more", 5, v1[6:]) // legacy has ten
	return te
}

// TestReplayAll stores 100 runs of six workflows and replays them against code with a change of
// every kind, and finds exactly the runs that diverge, and where; the engine, resuming the same
// runs on the same code, agrees with it.
func TestReplayAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	te := storedRuns(t, ctx)
	runs, err := workflowtest.LoadRuns(ctx, te.Engine(), nil)
	require.NoError(t, err)
	require.Len(t, runs, 100)

	var before string
	require.NoError(t, te.DB().QueryRow(ctx, `SELECT md5(string_agg(r.state || r.updated_at || r.attempts, ',' ORDER BY r.id, r.scope)) ||
		(SELECT count(*) FROM idem_steps) FROM idem_runs r`).Scan(&before))
	ran := executed.Load()
	report, err := workflowtest.ReplayAll(ctx, definitions(v2), runs)
	require.NoError(t, err)
	require.Equal(t, 100, report.Replayed)
	require.Equal(t, ran, executed.Load(), "no step's function ran")
	var after string
	require.NoError(t, te.DB().QueryRow(ctx, `SELECT md5(string_agg(r.state || r.updated_at || r.attempts, ',' ORDER BY r.id, r.scope)) ||
		(SELECT count(*) FROM idem_steps) FROM idem_runs r`).Scan(&after))
	require.Equal(t, before, after, "nothing was written")

	got := map[string]string{} // workflow/id -> where it diverges, or the problem
	for _, p := range report.Problems {
		where := "not replayed"
		if nd := p.Divergence(); nd != nil {
			where = fmt.Sprintf("#%d %s:%s/%s:%s", nd.Seq, nd.StoredKind, nd.StoredName, nd.CalledKind, nd.CalledName)
		}
		got[p.Workflow+"/"+p.ID] = where
	}
	want := map[string]string{}
	for i := range 5 {
		for _, group := range []string{"done", "mid"} {
			id := fmt.Sprintf("%s-%d", group, i)
			want["order/"+id] = "#3 call:charge/call:fraud"
			want["refund/"+id] = "#3 call:refund/call:refund-v2"
			want["report/"+id] = "#3 tx:store/call:store"
		}
		want[fmt.Sprintf("signup/done-%d", i)] = "#5 call:survey/:"
		for _, group := range []string{"done", "mid", "early"} {
			want[fmt.Sprintf("promo/%s-%d", group, i)] = "#2 patch:bonus/call:bonus"
		}
		want[fmt.Sprintf("legacy/done-%d", i)] = "not replayed"
		want[fmt.Sprintf("legacy/more-%d", i)] = "not replayed"
	}
	require.Equal(t, want, got)
	require.Len(t, report.Problems, 60)
	for _, p := range report.Problems {
		if p.Workflow == "legacy" {
			require.ErrorContains(t, p.Err, `workflow "legacy"`)
			require.ErrorContains(t, p.Err, "not in the code")
		}
	}

	// An export says the same.
	var buf bytes.Buffer
	require.NoError(t, json.NewEncoder(&buf).Encode(workflowtest.Export{Runs: runs}))
	exported, err := workflowtest.ReadExport(&buf)
	require.NoError(t, err)
	again, err := workflowtest.ReplayAll(ctx, definitions(v2), exported)
	require.NoError(t, err)
	a, _ := json.Marshal(report)
	b, _ := json.Marshal(again)
	require.JSONEq(t, string(a), string(b))

	// The engine agrees: deployed, v2 fails exactly the unfinished runs the replayer named, with
	// the same divergence, and finishes the others.
	te2 := workflowtest.New(t, &workflowtest.Config{Workflows: append(definitions(v2), v1[6]), DB: te.DB()})
	require.NoError(t, te2.Advance(ctx, 3*time.Hour))
	var failed, done []string
	for _, run := range runs {
		if strings.HasPrefix(run.ID, "done-") || run.Workflow == "legacy" {
			continue
		}
		now, err := te2.Engine().RunGet(ctx, idem.Key{Scope: run.Scope, ID: run.ID})
		require.NoError(t, err)
		name := run.Workflow + "/" + run.ID
		switch now.State {
		case workflow.RunStateFailed:
			require.Equal(t, workflow.FailureNondeterministic, now.Reason)
			d := now.Divergence
			require.Equal(t, want[name], fmt.Sprintf("#%d %s:%s/%s:%s", d.Seq, d.StoredKind, d.StoredName, d.CalledKind, d.CalledName))
			failed = append(failed, name)
		case workflow.RunStateDone:
			require.NotContains(t, want, name)
			done = append(done, name)
		default:
			t.Fatalf("run %s is %s", name, now.State)
		}
	}
	var wantFailed []string
	for name := range want {
		if !strings.Contains(name, "/done-") && !strings.HasPrefix(name, "legacy/") {
			wantFailed = append(wantFailed, name)
		}
	}
	sort.Strings(failed)
	sort.Strings(wantFailed)
	require.Equal(t, wantFailed, failed)
	require.Len(t, done, 60-len(wantFailed))
}

// TestReplay: one run at a time, and what is not a history of the workflow.
func TestReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	te := workflowtest.New(t, &workflowtest.Config{Workflows: definitions(v1[:2])})
	key := idem.Key{Scope: "refund", ID: "r"}
	_, err := v1[1].Run(ctx, te.Engine(), key, 1, nil)
	require.ErrorIs(t, err, idem.ErrInFlight)
	run, err := te.Engine().RunGet(ctx, key)
	require.NoError(t, err)

	require.NoError(t, workflowtest.Replay(ctx, v1[1], run), "a run replays on its own code")
	err = workflowtest.Replay(ctx, v1[0], run)
	require.ErrorContains(t, err, `is a run of workflow "refund", not of "order"`)

	twice := *run
	twice.Steps = append([]workflow.StepRow{run.Steps[0]}, run.Steps...)
	require.ErrorContains(t, workflowtest.Replay(ctx, v1[1], &twice), "has step #1 twice")

	_, err = workflowtest.ReadExport(strings.NewReader(`[1, 2]`))
	require.ErrorContains(t, err, "what idem runs export writes")
	_, err = workflowtest.ReadExport(strings.NewReader(`{}`))
	require.ErrorContains(t, err, `has no "runs"`)
	_, err = workflowtest.ReadExport(strings.NewReader(`{"runs": [{"scope": "s"}]}`))
	require.ErrorContains(t, err, "run #1 of the export has no workflow or key")

	// A stored output that no longer decodes is a problem too, with where.
	changed := workflow.Define("refund", func(ctx context.Context, in int) (int, error) {
		_, err := steps.Call(ctx, "lookup", func(context.Context, string) (struct{ A int }, error) { return struct{ A int }{}, nil }, nil)
		return 0, err
	})
	err = workflowtest.Replay(ctx, changed, run)
	require.ErrorContains(t, err, "stopped at step #1")
	require.ErrorContains(t, err, `stored output of step "lookup" cannot be decoded`)
}
