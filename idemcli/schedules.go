package idemcli

import (
	"context"
	"flag"
	"fmt"
	"strconv"

	"github.com/idemkit/idem/workflow"
)

// Schedules are defined in code (Workflow.Schedule, where the workflow and its input's type are
// known); the CLI reads and steers them.

type scheduleFlags struct {
	workflows, after, note, from, to string
	limit                            int
}

var schedulesListCmd = &command{
	name:    "schedules list",
	summary: "List schedules by name, with their next tick and their last run.",
	help: "--workflow takes a comma-separated list. When more schedules match than --limit, the\n" +
		"last line gives the --after of the next page.",
	flags: func(fs *flag.FlagSet, c *call) {
		fs.StringVar(&c.sched.workflows, "workflow", "", "only schedules of these workflows")
		fs.IntVar(&c.sched.limit, "limit", workflow.DefaultRunListLimit, fmt.Sprintf("page size, at most %d", workflow.MaxRunListLimit))
		fs.StringVar(&c.sched.after, "after", "", "name of the last schedule of the page before")
	},
	run: func(ctx context.Context, c *call) error {
		if c.sched.limit < 1 || c.sched.limit > workflow.MaxRunListLimit {
			return usagef("--limit must be between 1 and %d (got %d)", workflow.MaxRunListLimit, c.sched.limit)
		}
		return c.withEngine(ctx, false, func(e *workflow.Engine) error {
			res, err := e.ScheduleList(ctx, &workflow.ScheduleListParams{Workflows: splitList(c.sched.workflows), After: c.sched.after, Limit: c.sched.limit})
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(res)
			}
			t := newTable(c.stdout)
			t.row("NAME", "WORKFLOW", "WHEN", "STATE", "NEXT TICK", "LAST RUN", "STARTED", "SKIPPED")
			for _, s := range res.Schedules {
				t.row(s.Name, s.Workflow, when(s), scheduleState(s), stamp(s.NextTick), lastRun(s), strconv.FormatInt(s.TicksStarted, 10),
					strconv.FormatInt(s.TicksSkipped, 10))
			}
			t.flush()
			if res.Next != "" {
				fmt.Fprintf(c.stdout, "more: --after %s\n", res.Next)
			}
			return nil
		})
	},
}

var schedulesShowCmd = &command{
	name:    "schedules show",
	args:    []string{"NAME"},
	summary: "Show a schedule.",
	run: func(ctx context.Context, c *call) error {
		return c.withEngine(ctx, false, func(e *workflow.Engine) error {
			s, err := e.ScheduleGet(ctx, c.args[0])
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(s)
			}
			t := newTable(c.stdout)
			t.row("name", s.Name)
			t.row("workflow", s.Workflow)
			t.row("when", when(s))
			t.row("time zone", s.TimeZone)
			t.row("overlap", string(s.Overlap))
			t.row("catch up", string(s.CatchUp))
			t.row("state", scheduleState(s))
			if s.PauseNote != "" {
				t.row("pause note", s.PauseNote)
			}
			t.row("next tick", stamp(s.NextTick))
			t.row("last tick", stampPtr(s.LastTick))
			t.row("last run", lastRun(s))
			t.row("runs' scope", s.Scope)
			t.row("started", strconv.FormatInt(s.TicksStarted, 10))
			t.row("skipped", strconv.FormatInt(s.TicksSkipped, 10))
			t.row("input", clip(string(s.Input), 200))
			for _, k := range sortedKeys(s.Attributes) {
				t.row("attribute", k+"="+s.Attributes[k])
			}
			t.row("created", stamp(s.Created))
			t.row("updated", stamp(s.Updated))
			t.flush()
			return nil
		})
	},
}

var schedulesPauseCmd = &command{
	name:    "schedules pause",
	args:    []string{"NAME"},
	summary: "Pause a schedule: it starts no ticks until resumed; its runs go on.",
	flags: func(fs *flag.FlagSet, c *call) {
		fs.StringVar(&c.sched.note, "note", "", "why, shown to other operators")
	},
	run: func(ctx context.Context, c *call) error {
		return c.withEngine(ctx, false, func(e *workflow.Engine) error {
			if err := e.SchedulePause(ctx, c.args[0], c.sched.note); err != nil {
				return err
			}
			return c.done(fmt.Sprintf("paused schedule %q", c.args[0]), map[string]any{"paused": true, "name": c.args[0]})
		})
	},
}

var schedulesResumeCmd = &command{
	name:    "schedules resume",
	args:    []string{"NAME"},
	summary: "Resume a paused schedule from its next tick after now.",
	help:    "Ticks that passed while it was paused are not started; backfill them for that.",
	run: func(ctx context.Context, c *call) error {
		return c.withEngine(ctx, false, func(e *workflow.Engine) error {
			if err := e.ScheduleResume(ctx, c.args[0]); err != nil {
				return err
			}
			return c.done(fmt.Sprintf("resumed schedule %q", c.args[0]), map[string]any{"resumed": true, "name": c.args[0]})
		})
	},
}

var schedulesDeleteCmd = &command{
	name:    "schedules delete",
	args:    []string{"NAME"},
	summary: "Delete a schedule; the runs it started stay.",
	help:    "An application that defines the schedule at its start defines it again: pause it instead.",
	run: func(ctx context.Context, c *call) error {
		return c.withEngine(ctx, false, func(e *workflow.Engine) error {
			if err := e.ScheduleDelete(ctx, c.args[0]); err != nil {
				return err
			}
			return c.done(fmt.Sprintf("deleted schedule %q", c.args[0]), map[string]any{"deleted": true, "name": c.args[0]})
		})
	},
}

var schedulesTriggerCmd = &command{
	name:    "schedules trigger",
	args:    []string{"NAME"},
	summary: "Start a run of a schedule now, whatever its next tick, pause or overlap policy.",
	help:    "The run is worked by the application's River workers, through a job inserted here.",
	flags:   riverFlags,
	run: func(ctx context.Context, c *call) error {
		return c.withEngine(ctx, true, func(e *workflow.Engine) error {
			key, err := e.ScheduleTrigger(ctx, c.args[0])
			if err != nil {
				return err
			}
			return c.done(fmt.Sprintf("started run %q in scope %q", key.ID, key.Scope), map[string]any{"started": true, "scope": key.Scope, "id": key.ID})
		})
	},
}

var schedulesBackfillCmd = &command{
	name:    "schedules backfill",
	args:    []string{"NAME"},
	summary: "Start a run for each tick of a schedule from --from up to --to.",
	help: "--from and --to take an RFC 3339 time or a duration before now (24h); --to defaults to\n" +
		"now. A tick whose run exists already is left alone, so a backfill can be repeated; at most\n" +
		"1000 ticks at once.",
	flags: func(fs *flag.FlagSet, c *call) {
		fs.StringVar(&c.sched.from, "from", "", "first tick time to start, inclusive (required)")
		fs.StringVar(&c.sched.to, "to", "", "tick time to stop before (default: now)")
		riverFlags(fs, c)
	},
	run: func(ctx context.Context, c *call) error {
		if c.sched.from == "" {
			return usagef("--from is required: the first tick time to start")
		}
		from, err := parseTime("from", c.sched.from)
		if err != nil {
			return err
		}
		to, err := parseTime("to", c.sched.to)
		if err != nil {
			return err
		}
		return c.withEngine(ctx, true, func(e *workflow.Engine) error {
			res, err := e.ScheduleBackfill(ctx, c.args[0], from, to)
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(res)
			}
			for _, k := range res.Started {
				fmt.Fprintf(c.stdout, "started run %q in scope %q\n", k.ID, k.Scope)
			}
			_, err = fmt.Fprintf(c.stdout, "%d started, %d had run already\n", len(res.Started), res.Existing)
			return err
		})
	},
}

// when says when a schedule ticks.
func when(s *workflow.ScheduleRow) string {
	if s.Cron != "" {
		if s.TimeZone != "" && s.TimeZone != "UTC" {
			return s.Cron + " (" + s.TimeZone + ")"
		}
		return s.Cron
	}
	return "every " + s.Every.String()
}

func scheduleState(s *workflow.ScheduleRow) string {
	if s.Paused {
		return "paused"
	}
	return "active"
}

func lastRun(s *workflow.ScheduleRow) string {
	if s.LastRun == nil {
		return "-"
	}
	return s.LastRun.ID + " (" + orDash(string(s.LastRunState)) + ")"
}
