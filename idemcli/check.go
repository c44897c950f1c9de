package idemcli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"

	"github.com/idemkit/idem/workflow"
	"github.com/idemkit/idem/workflow/workflowtest"
)

// unfinished are the states of the runs a deploy resumes: runs check looks at them by default.
var unfinished = []workflow.RunState{workflow.RunStateQueued, workflow.RunStateRunning, workflow.RunStateSleeping, workflow.RunStateAwaiting}

// selected keeps the runs that p's filters select.
func selected(runs []*workflow.RunRow, p *workflow.RunListParams) []*workflow.RunRow {
	in := func(list []string, v string) bool { return len(list) == 0 || slices.Contains(list, v) }
	has := func(attrs map[string]string) bool {
		for k, v := range p.Attributes {
			if attrs[k] != v {
				return false
			}
		}
		return true
	}
	var out []*workflow.RunRow
	for _, r := range runs {
		if in(p.Workflows, r.Workflow) && in(p.Versions, r.Version) && (len(p.States) == 0 || slices.Contains(p.States, r.State)) && has(r.Attributes) &&
			(p.Scope == "" || p.Scope == r.Scope) && (p.Since.IsZero() || !r.Created.Before(p.Since)) && (p.Until.IsZero() || r.Created.Before(p.Until)) {
			out = append(out, r)
		}
	}
	return out
}

var runsExportCmd = &command{
	name:    "runs export",
	summary: "Write runs with their inputs and histories as JSON, for runs check or workflowtest.ReadExport.",
	help: "Takes the filters of runs list (--state, --workflow, --version, --scope, --since, --until,\n" +
		"--attr) and writes every run they select, page after page, to --out (default: standard\n" +
		"output). Inputs and step outputs are written as stored: treat the file as you treat the\n" +
		"database.",
	flags: func(fs *flag.FlagSet, c *call) {
		filterFlags(fs, c)
		fs.StringVar(&c.file, "out", "", "file to write (default: standard output)")
	},
	run: func(ctx context.Context, c *call) error {
		p, err := c.listParams()
		if err != nil {
			return err
		}
		return c.withEngine(ctx, false, func(e *workflow.Engine) error {
			runs, err := workflowtest.LoadRuns(ctx, e, p)
			if err != nil {
				return err
			}
			out := c.stdout
			if c.file != "" {
				f, err := os.Create(c.file)
				if err != nil {
					return fmt.Errorf("error creating --out: %w", err)
				}
				defer f.Close()
				out = f
			}
			if err := json.NewEncoder(out).Encode(workflowtest.Export{Runs: runs}); err != nil {
				return fmt.Errorf("error writing the export: %w", err)
			}
			if c.file != "" {
				fmt.Fprintf(c.stderr, "exported %d runs to %s\n", len(runs), c.file)
			}
			return nil
		})
	},
}

var runsCheckCmd = &command{
	name:    "runs check",
	summary: "Replay stored runs against this build's workflows, and list those that would diverge.",
	help: "Replays each run's history against the workflow code built into this command (see\n" +
		"package idemcli: an application builds it with its workflows), as a resumed run replays\n" +
		"it, with no effects: no step runs and nothing is written. Runs come from the database,\n" +
		"selected by the filters of runs list (by default the unfinished ones: queued, running,\n" +
		"sleeping, awaiting), or from --file, an export of runs export. Exits 1 when a run would\n" +
		"not resume on this code: run it in CI before a deploy that changes workflows.",
	flags: func(fs *flag.FlagSet, c *call) {
		filterFlags(fs, c)
		fs.StringVar(&c.file, "file", "", "an export (runs export) to check instead of the database")
	},
	run: func(ctx context.Context, c *call) error {
		if len(c.cfg.Workflows) == 0 {
			return usagef("this idem command has no workflows to replay runs against: build one into your application with " +
				"idemcli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, &idemcli.Config{Workflows: ...}), " +
				"or replay an export in a test with workflowtest.ReadExport and workflowtest.ReplayAll")
		}
		p, err := c.listParams()
		if err != nil {
			return err
		}
		var runs []*workflow.RunRow
		if c.file != "" {
			f, err := os.Open(c.file)
			if err != nil {
				return fmt.Errorf("error opening --file: %w", err)
			}
			defer f.Close()
			if runs, err = workflowtest.ReadExport(f); err != nil {
				return err
			}
			runs = selected(runs, p) // the export holds what it was made with; the flags narrow it
		} else if len(p.States) == 0 {
			p.States = unfinished
		}
		if c.file == "" {
			err = c.withEngine(ctx, false, func(e *workflow.Engine) error {
				runs, err = workflowtest.LoadRuns(ctx, e, p)
				return err
			})
			if err != nil {
				return err
			}
		}
		report, err := workflowtest.ReplayAll(ctx, c.cfg.Workflows, runs)
		if err != nil {
			return err
		}
		if c.json {
			if err := c.printJSON(report); err != nil {
				return err
			}
		} else {
			t := newTable(c.stdout)
			t.row("SCOPE", "ID", "WORKFLOW", "STEP", "HISTORY", "CODE")
			for _, p := range report.Problems {
				if nd := p.Divergence(); nd != nil {
					code := "returned"
					if nd.CalledKind != "" {
						code = nd.CalledKind + " " + strconv.Quote(nd.CalledName)
					}
					t.row(p.Scope, p.ID, p.Workflow, strconv.Itoa(nd.Seq), nd.StoredKind+" "+strconv.Quote(nd.StoredName), code)
					continue
				}
				t.row(p.Scope, p.ID, p.Workflow, "-", "-", clip(p.Err.Error(), 160))
			}
			t.flush()
			fmt.Fprintf(c.stdout, "replayed %d runs: %d would not resume on this code\n", report.Replayed, len(report.Problems))
		}
		if len(report.Problems) > 0 {
			return fmt.Errorf("%d of %d runs would not resume on this code: patch the changes they meet (workflow.Patched), or let them finish first", len(report.Problems), report.Replayed)
		}
		return nil
	},
}
