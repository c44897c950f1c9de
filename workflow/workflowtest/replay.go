package workflowtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wfseam"
	"github.com/idemkit/idem/workflow"
)

// Replay replays a stored run (its input and history, as Engine.RunGet returns it or an export
// holds it) against the current code of wf, the way the engine replays a run it resumes, with no
// effects: no step's function runs, nothing is written, no database is needed. It returns nil
// when the code calls the steps of the history in their order (up to the end of the history,
// where a resumed run would go on with new steps), a *workflow.NonDeterminismError saying
// where the code diverges (the run would fail with it), and another error when the run cannot
// be replayed at all: a history of another workflow, a stored input or step output that no
// longer decodes, a panic.
//
// Run it in CI against histories exported from production (idem runs export), before a deploy
// that changes workflows, to find the runs it would break:
//
//	run, err := engine.RunGet(ctx, key)
//	...
//	if err := workflowtest.Replay(ctx, Payout, run); err != nil {
//		var nd *workflow.NonDeterminismError
//		if errors.As(err, &nd) {
//			t.Errorf("run %s would diverge at step %d", run.ID, nd.Seq)
//		}
//	}
func Replay(ctx context.Context, wf workflow.Definition, run *workflow.RunRow) error {
	if wf == nil || run == nil {
		return errors.New("workflowtest: Replay needs a workflow and a run")
	}
	return wfseam.Replay(ctx, wf, run)
}

// ReplayReport is what ReplayAll found: how many runs it replayed, and the runs that would not
// resume on the code, in the order they were given.
//
//	report, err := workflowtest.ReplayAll(ctx, workflows, runs)
//	for _, p := range report.Problems {
//		t.Errorf("%s %s/%s: %v", p.Workflow, p.Scope, p.ID, p.Err)
//	}
type ReplayReport struct {
	Replayed int             `json:"replayed"`
	Problems []ReplayProblem `json:"problems"`
}

// ReplayProblem is a run that would not resume on the code: Err is a
// *workflow.NonDeterminismError (Divergence returns it) where the code diverges from its
// history, or why the run could not be replayed (its workflow is not in the code, a stored value
// no longer decodes, ...).
//
//	if nd := p.Divergence(); nd != nil {
//		fmt.Printf("%s diverges at step %d\n", p.ID, nd.Seq)
//	}
type ReplayProblem struct {
	Scope    string `json:"scope"`
	ID       string `json:"id"`
	Workflow string `json:"workflow"`
	Err      error  `json:"-"`
}

// Divergence returns the problem's divergence, nil when the replay failed otherwise.
//
//	nd := p.Divergence()
func (p *ReplayProblem) Divergence() *workflow.NonDeterminismError {
	var nd *workflow.NonDeterminismError
	if errors.As(p.Err, &nd) {
		return nd
	}
	return nil
}

// MarshalJSON writes the problem with its error's text and, for a divergence, where.
func (p ReplayProblem) MarshalJSON() ([]byte, error) {
	type plain ReplayProblem
	out := struct {
		plain
		Error      string               `json:"error"`
		Divergence *workflow.Divergence `json:"divergence,omitempty"`
	}{plain: plain(p), Error: p.Err.Error()}
	if nd := p.Divergence(); nd != nil {
		out.Divergence = &nd.Divergence
	}
	return json.Marshal(out)
}

// ReplayAll replays each run against the workflow of its name among workflows (see [Replay]),
// and reports every run that would not resume: a run whose workflow is not among them is one
// too (a deploy of this code would leave it unregistered). The error is only for a ctx that
// ended.
//
//	report, err := workflowtest.ReplayAll(ctx, []workflow.Definition{Payout, Refund}, runs)
func ReplayAll(ctx context.Context, workflows []workflow.Definition, runs []*workflow.RunRow) (*ReplayReport, error) {
	byName := make(map[string]workflow.Definition, len(workflows))
	for _, wf := range workflows {
		byName[wf.Name()] = wf
	}
	report := &ReplayReport{Problems: []ReplayProblem{}}
	for _, run := range runs {
		if err := ctx.Err(); err != nil {
			return report, err
		}
		wf, ok := byName[run.Workflow]
		var err error
		if ok {
			err = Replay(ctx, wf, run)
		} else {
			err = fmt.Errorf("workflowtest: workflow %q of run %q in scope %q is not in the code replayed against", run.Workflow, run.ID, run.Scope)
		}
		report.Replayed++
		if err != nil {
			report.Problems = append(report.Problems, ReplayProblem{Scope: run.Scope, ID: run.ID, Workflow: run.Workflow, Err: err})
		}
	}
	return report, ctx.Err()
}

// Export is what idem runs export writes, and what ReadExport reads: runs with their inputs and
// histories, as Engine.RunGet returns them.
//
//	err := json.NewEncoder(f).Encode(workflowtest.Export{Runs: runs})
type Export struct {
	Runs []*workflow.RunRow `json:"runs"`
}

// ReadExport reads the runs of an export (idem runs export). A document that is not one is an
// error that says so.
//
//	f, err := os.Open("testdata/production-runs.json")
//	...
//	runs, err := workflowtest.ReadExport(f)
//	report, err := workflowtest.ReplayAll(ctx, app.Workflows, runs)
func ReadExport(r io.Reader) ([]*workflow.RunRow, error) {
	var ex Export
	if err := json.NewDecoder(r).Decode(&ex); err != nil {
		return nil, fmt.Errorf("workflowtest: the export cannot be read (it should be what idem runs export writes: {\"runs\": [...]}): %w", err)
	}
	if ex.Runs == nil {
		return nil, errors.New("workflowtest: the export has no \"runs\"; it should be what idem runs export writes: {\"runs\": [...]}")
	}
	for i, run := range ex.Runs {
		if run == nil || run.Workflow == "" || run.ID == "" {
			return nil, fmt.Errorf("workflowtest: run #%d of the export has no workflow or key; it should be what idem runs export writes", i+1)
		}
	}
	return ex.Runs, nil
}

// LoadRuns reads the runs that params select (all of them, page after page) with their inputs
// and histories, for ReplayAll or an export. Runs that are reaped or forgotten between the
// listing and the reading of their history are left out.
//
//	runs, err := workflowtest.LoadRuns(ctx, engine, &workflow.RunListParams{
//		States: []workflow.RunState{workflow.RunStateRunning, workflow.RunStateSleeping, workflow.RunStateAwaiting},
//	})
func LoadRuns(ctx context.Context, e *workflow.Engine, params *workflow.RunListParams) ([]*workflow.RunRow, error) {
	page := workflow.RunListParams{Limit: workflow.MaxRunListLimit}
	if params != nil {
		page = *params
		if page.Limit == 0 {
			page.Limit = workflow.MaxRunListLimit
		}
	}
	var runs []*workflow.RunRow
	for {
		res, err := e.RunList(ctx, &page)
		if err != nil {
			return nil, err
		}
		for _, r := range res.Runs {
			run, err := e.RunGet(ctx, idem.Key{Scope: r.Scope, ID: r.ID})
			switch {
			case errors.Is(err, idem.ErrNotFound):
				continue
			case err != nil:
				return nil, err
			}
			runs = append(runs, run)
		}
		if res.Next == "" {
			return runs, nil
		}
		page.After = res.Next
	}
}
