package idemcli

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/workflow"
)

// engine makes a workflow engine with no workflows registered: everything the CLI does works
// on the database alone. withRiver gives it an insert-only River client (no workers, no
// queues: it never works a job) for the resume jobs of resume and fork.
func (c *call) engine(pool *pgxpool.Pool, withRiver bool) (*workflow.Engine, error) {
	e, err := workflow.NewEngine(pool, &workflow.Config{Schema: c.schema, Queue: c.queue, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, usagef("%v", err)
	}
	if withRiver {
		client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: c.riverSchema, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, fmt.Errorf("error making a River client: %w", err)
		}
		e.SetClient(client)
	}
	return e, nil
}

// withEngine connects, makes the engine and runs f.
func (c *call) withEngine(ctx context.Context, withRiver bool, f func(e *workflow.Engine) error) error {
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	e, err := c.engine(pool, withRiver)
	if err != nil {
		return err
	}
	return f(e)
}

func riverFlags(fs *flag.FlagSet, c *call) {
	fs.StringVar(&c.queue, "queue", "", "River queue of the resume job: the engine's Config.Queue (default River's default queue)")
	fs.StringVar(&c.riverSchema, "river-schema", "", "Postgres schema of River's tables (default: search_path decides)")
}

type listFlags struct {
	states, workflows, versions, scope, since, until, after, parent string
	limit                                                           int
	attrs                                                           map[string]string
}

var runsListCmd = &command{
	name:    "runs list",
	summary: "List runs, newest first.",
	help: "--since and --until take an RFC 3339 time or a duration before now (24h, 90m).\n" +
		"--state, --workflow and --version take a comma-separated list. --parent lists the\n" +
		"children of the run with that ID in --scope. When more runs match than --limit, the\n" +
		"last line gives the --after cursor of the next page.",
	flags: func(fs *flag.FlagSet, c *call) {
		filterFlags(fs, c)
		fs.IntVar(&c.list.limit, "limit", workflow.DefaultRunListLimit, fmt.Sprintf("page size, at most %d", workflow.MaxRunListLimit))
		fs.StringVar(&c.list.after, "after", "", "cursor of the page before, from the previous listing")
		fs.StringVar(&c.list.parent, "parent", "", "only the children of the run with this ID (in --scope)")
	},
	run: func(ctx context.Context, c *call) error {
		p, err := c.listParams()
		if err != nil {
			return err
		}
		p.Limit, p.After = c.list.limit, c.list.after
		if c.list.parent != "" {
			if c.list.scope == "" {
				return usagef("--parent needs --scope: a run's children are in its scope")
			}
			parent, err := c.key(c.list.scope, c.list.parent)
			if err != nil {
				return err
			}
			p.Parent = &parent
		}
		if c.list.limit < 1 || c.list.limit > workflow.MaxRunListLimit {
			return usagef("--limit must be between 1 and %d (got %d)", workflow.MaxRunListLimit, c.list.limit)
		}
		return c.withEngine(ctx, false, func(e *workflow.Engine) error {
			res, err := e.RunList(ctx, p)
			if errors.Is(err, workflow.ErrInvalidCursor) {
				return usagef("--after %q is not a cursor that runs list printed (its last line, \"more: --after ...\")", c.list.after)
			}
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(res)
			}
			t := newTable(c.stdout)
			t.row("CREATED", "SCOPE", "ID", "WORKFLOW", "VERSION", "STATE", "ATTEMPTS", "ERROR")
			for _, r := range res.Runs {
				t.row(stamp(r.Created), r.Scope, r.ID, r.Workflow, orDash(clip(r.Version, 12)), string(r.State), strconv.Itoa(r.Attempts),
					orDash(clip(cmp.Or(r.Error, r.LastError), 80)))
			}
			t.flush()
			if res.Next != "" {
				fmt.Fprintf(c.stdout, "more: --after %s\n", res.Next)
			}
			return nil
		})
	},
}

var runsShowCmd = &command{
	name:    "runs show",
	args:    []string{"SCOPE", "ID"},
	summary: "Show a run and its steps.",
	run: func(ctx context.Context, c *call) error {
		key, err := c.key(c.args[0], c.args[1])
		if err != nil {
			return err
		}
		return c.withEngine(ctx, false, func(e *workflow.Engine) error {
			r, err := e.RunGet(ctx, key)
			if err != nil {
				return err
			}
			if c.json {
				// The hash that stands for the run's key in idem's spans and logs, beside the run.
				return c.printJSON(struct {
					*workflow.RunRow
					Hash string `json:"key_hash"`
				}{r, redact.Hash(r.Scope, r.ID)})
			}
			t := newTable(c.stdout)
			t.row("scope", r.Scope)
			t.row("id", r.ID)
			t.row("hash", redact.Hash(r.Scope, r.ID))
			t.row("workflow", r.Workflow)
			t.row("state", string(r.State))
			t.row("attempts", strconv.Itoa(r.Attempts))
			t.row("version", orDash(r.Version))
			if r.AttemptVersion != "" && r.AttemptVersion != r.Version {
				t.row("attempt version", r.AttemptVersion)
			}
			lease := "-"
			if r.LeaseOwner != "" || r.LeaseExpires != nil {
				lease = orDash(r.LeaseOwner) + " until " + stampPtr(r.LeaseExpires)
			}
			t.row("lease", lease)
			if r.State == workflow.RunStateSleeping || r.State == workflow.RunStateAwaiting {
				t.row("wakes", stampPtr(r.WakeAt))
			}
			if r.AwaitingSignal != "" {
				t.row("awaiting", r.AwaitingSignal)
			}
			if r.Deadline != nil {
				t.row("deadline", stampPtr(r.Deadline))
			}
			if r.PendingSignals > 0 {
				t.row("mailbox", strconv.Itoa(r.PendingSignals)+" pending signals")
			}
			if f := r.ForkedFrom; f != nil {
				copied := "no step copied"
				if f.Steps > 0 {
					copied = "its first step copied"
					if f.Steps > 1 {
						copied = fmt.Sprintf("its first %d steps copied", f.Steps)
					}
				}
				t.row("forked from", fmt.Sprintf("%s %s, %s", f.Key.Scope, f.Key.ID, copied))
			}
			for _, k := range sortedKeys(r.Attributes) {
				t.row("attribute", k+"="+r.Attributes[k])
			}
			t.row("created", stamp(r.Created))
			t.row("updated", stamp(r.Updated))
			t.row("finished", stampPtr(r.Finished))
			t.row("expires", stampPtr(r.Expires))
			t.row("input", clip(string(r.Input), 200))
			if r.Reason != "" {
				t.row("reason", string(r.Reason))
			}
			if d := r.Divergence; d != nil {
				called := "returned"
				if d.CalledKind != "" {
					called = fmt.Sprintf("called %s %q", d.CalledKind, d.CalledName)
				}
				t.row("diverged", fmt.Sprintf("at step %d: the history has %s %q, the code %s", d.Seq, d.StoredKind, d.StoredName, called))
			}
			switch {
			case r.Error != "":
				t.row("error", r.Error)
			case r.Output != nil:
				t.row("output", clip(string(r.Output), 200))
			}
			if r.LastError != "" {
				t.row("last error", r.LastError)
			}
			if r.Parent != nil {
				t.row("parent", fmt.Sprintf("%s %s (step #%d)", r.Parent.Key.Scope, r.Parent.Key.ID, r.Parent.Seq))
			}
			t.flush()
			fmt.Fprintln(c.stdout)
			t = newTable(c.stdout)
			t.row("SEQ", "STEP", "KIND", "ATTEMPTS", "AT", "RESULT")
			for _, s := range r.Steps {
				result := string(s.Output)
				switch {
				case s.Error != "":
					result = "error: " + s.Error
				case s.Kind == "sleep":
					result = sleepResult(s)
				}
				t.row(strconv.Itoa(s.Seq), s.Name, s.Kind, strconv.Itoa(s.Attempts), stamp(s.Created), clip(result, 80))
			}
			t.flush()
			if len(r.Children) > 0 {
				fmt.Fprintln(c.stdout)
				t = newTable(c.stdout)
				t.row("STEP", "CHILD", "WORKFLOW", "STATE", "CREATED")
				for _, ch := range r.Children {
					t.row(strconv.Itoa(ch.Seq), ch.Key.ID, ch.Workflow, string(ch.State), stamp(ch.Created))
				}
				t.flush()
			}
			if len(r.Failures) > 0 {
				// Every failed attempt, not only the last: why a step ran three times.
				fmt.Fprintln(c.stdout)
				t = newTable(c.stdout)
				t.row("SEQ", "STEP", "ATTEMPT", "AT", "OUTCOME", "ERROR")
				for _, a := range r.Failures {
					t.row(strconv.Itoa(a.Seq), a.Step, strconv.Itoa(a.Attempt), stamp(a.At), string(a.Outcome), clip(a.Error, 120))
				}
				t.flush()
			}
			return nil
		})
	},
}

var runsCancelCmd = &command{
	name:    "runs cancel",
	args:    []string{"SCOPE", "ID"},
	summary: "Cancel a run: it stops at its next step boundary; retries get the cancellation.",
	help:    "Cancelling a cancelled run does nothing; a done or failed run cannot be cancelled.",
	flags: func(fs *flag.FlagSet, c *call) {
		fs.StringVar(&c.reason, "reason", "", "why, stored with the run and returned to its callers")
	},
	run: func(ctx context.Context, c *call) error {
		key, err := c.key(c.args[0], c.args[1])
		if err != nil {
			return err
		}
		return c.withEngine(ctx, false, func(e *workflow.Engine) error {
			if err := e.RunCancel(ctx, key, c.reason); err != nil {
				return err
			}
			return c.done(fmt.Sprintf("cancelled run %q in scope %q", key.ID, key.Scope), map[string]any{"cancelled": true, "scope": key.Scope, "id": key.ID})
		})
	},
}

var runsResumeCmd = &command{
	name:    "runs resume",
	args:    []string{"SCOPE", "ID"},
	summary: "Continue a failed, cancelled or stuck run from its last completed step.",
	help: "A failed run runs its failed step again. The run is continued by the application's\n" +
		"River workers, through a job inserted here.",
	flags: riverFlags,
	run: func(ctx context.Context, c *call) error {
		key, err := c.key(c.args[0], c.args[1])
		if err != nil {
			return err
		}
		return c.withEngine(ctx, true, func(e *workflow.Engine) error {
			if err := e.RunResume(ctx, key); err != nil {
				return err
			}
			return c.done(fmt.Sprintf("resuming run %q in scope %q", key.ID, key.Scope), map[string]any{"resumed": true, "scope": key.Scope, "id": key.ID})
		})
	},
}

var runsForkCmd = &command{
	name:    "runs fork",
	args:    []string{"SCOPE", "ID", "NEW_ID"},
	summary: "Start a copy of a run under a new key, rerunning it from step --from.",
	help: "Steps before --from are copied and replayed; the rest run again. The new key is in the\n" +
		"same scope unless --new-scope says otherwise, and must be unused.",
	flags: func(fs *flag.FlagSet, c *call) {
		fs.IntVar(&c.fromStep, "from", 0, "first step to run again, from 1 (required)")
		fs.StringVar(&c.newScope, "new-scope", "", "scope of the new key (default: the run's)")
		riverFlags(fs, c)
	},
	run: func(ctx context.Context, c *call) error {
		key, err := c.key(c.args[0], c.args[1])
		if err != nil {
			return err
		}
		scope := c.newScope
		if scope == "" {
			scope = key.Scope
		}
		newKey, err := c.key(scope, c.args[2])
		if err != nil {
			return err
		}
		if c.fromStep < 0 {
			return usagef("--from is %d: give the first step to run again, a step number from 1 (idem runs show lists them)", c.fromStep)
		}
		if c.fromStep < 1 {
			return usagef("--from is required: the first step to run again, from 1")
		}
		return c.withEngine(ctx, true, func(e *workflow.Engine) error {
			if err := e.RunFork(ctx, key, newKey, c.fromStep); err != nil {
				return err
			}
			return c.done(fmt.Sprintf("forked run %q in scope %q into %q in scope %q from step %d", key.ID, key.Scope, newKey.ID, newKey.Scope, c.fromStep),
				map[string]any{"forked": true, "scope": key.Scope, "id": key.ID, "new_scope": newKey.Scope, "new_id": newKey.ID, "from_step": c.fromStep})
		})
	},
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// filterFlags are the flags that select runs, of runs list, export and check.
func filterFlags(fs *flag.FlagSet, c *call) {
	fs.StringVar(&c.list.states, "state", "", "only runs in these states (running,done,failed,cancelled,...)")
	fs.StringVar(&c.list.workflows, "workflow", "", "only runs of these workflows")
	fs.StringVar(&c.list.versions, "version", "", "only runs started by these code versions (workflow.Config.Version)")
	fs.StringVar(&c.list.scope, "scope", "", "only runs in this scope")
	fs.StringVar(&c.list.since, "since", "", "only runs created at or after this time")
	fs.StringVar(&c.list.until, "until", "", "only runs created before this time")
	fs.Func("attr", "only runs with attribute `k=v` (repeat for several)", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" || val == "" {
			return fmt.Errorf("--attr %q is not KEY=VALUE (both non-empty)", v)
		}
		if c.list.attrs == nil {
			c.list.attrs = map[string]string{}
		}
		c.list.attrs[k] = val
		return nil
	})
}

// listParams reads the flags of filterFlags.
func (c *call) listParams() (*workflow.RunListParams, error) {
	p := &workflow.RunListParams{Scope: c.list.scope, Workflows: splitList(c.list.workflows), Versions: splitList(c.list.versions),
		Attributes: c.list.attrs}
	for _, s := range splitList(c.list.states) {
		if !slices.Contains(states, workflow.RunState(s)) {
			return nil, usagef("--state %q is not a state of a run; the states are %s", s, strings.Join(stateNames(), ", "))
		}
		p.States = append(p.States, workflow.RunState(s))
	}
	var err error
	if p.Since, err = parseTime("since", c.list.since); err != nil {
		return nil, err
	}
	if p.Until, err = parseTime("until", c.list.until); err != nil {
		return nil, err
	}
	return p, nil
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// parseTime reads an RFC 3339 time, or a duration meaning that long ago.
func parseTime(name, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, usagef("--%s %q is neither an RFC 3339 time (2006-01-02T15:04:05Z) nor a duration (24h)", name, s)
}

// states are the states a run can be in.
var states = []workflow.RunState{workflow.RunStateQueued, workflow.RunStateRunning, workflow.RunStateSleeping, workflow.RunStateAwaiting,
	workflow.RunStateDone, workflow.RunStateFailed, workflow.RunStateCancelled, workflow.RunStateTimedOut}

func stateNames() []string {
	names := make([]string, len(states))
	for i, s := range states {
		names[i] = string(s)
	}
	return names
}

// sleepResult shows a sleep step's stored wake-up (µs since the epoch) as a time, and how long
// after the step was reached it is.
func sleepResult(s workflow.StepRow) string {
	us, err := strconv.ParseInt(string(s.Output), 10, 64)
	if err != nil {
		return string(s.Output)
	}
	wake := time.UnixMicro(us)
	return "until " + stamp(wake) + " (" + wake.Sub(s.Created).Round(time.Second).String() + " after the step)"
}
