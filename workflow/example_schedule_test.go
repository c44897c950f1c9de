package workflow_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// report is the workflow of the schedule examples.
var report = workflow.Define("report", func(ctx context.Context, team string) (string, error) {
	return steps.Tx(ctx, "tag", func(ctx context.Context, t pgx.Tx) (string, error) {
		// Attributes set here commit with the step.
		return "report for " + team, workflow.SetAttributesTx(ctx, t, map[string]string{"stage": "written"})
	}, nil)
})

func ExampleWorkflow_Schedule() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{report}, Logger: quietLogger()})
	if err != nil {
		log.Fatal(err)
	}
	defer engine.Close()

	// Defined at every start: the same timing keeps the schedule's next tick.
	err = report.Schedule(ctx, engine, "nightly-report", "billing", &workflow.ScheduleOpts{
		Cron:     "0 2 * * *",
		TimeZone: "Europe/Berlin",
		CatchUp:  workflow.CatchUpAll,
	})
	if err != nil {
		log.Fatal(err)
	}
	s, err := engine.ScheduleGet(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.Workflow, s.Cron, s.TimeZone, s.Overlap, s.CatchUp)
	fmt.Println("next tick at 02:00 in Berlin:", s.NextTick.In(mustZone("Europe/Berlin")).Format("15:04"))
	// Output:
	// report 0 2 * * * Europe/Berlin skip all
	// next tick at 02:00 in Berlin: 02:00
}

func ExampleSetAttributesTx() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{report}, Logger: quietLogger()})
	if err != nil {
		log.Fatal(err)
	}
	defer engine.Close()

	for _, team := range []string{"billing", "payments"} {
		key := idem.Key{Scope: "reports", ID: "r-" + team}
		opts := &workflow.RunOpts{Attributes: map[string]string{"team": team}}
		if _, err := report.Run(ctx, engine, key, team, opts); err != nil {
			log.Fatal(err)
		}
	}
	page, err := engine.RunList(ctx, &workflow.RunListParams{Attributes: map[string]string{"team": "payments"}})
	if err != nil {
		log.Fatal(err)
	}
	for _, run := range page.Runs {
		fmt.Println(run.ID, run.Attributes["team"], run.Attributes["stage"])
	}
	// Output:
	// r-payments payments written
}

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		log.Fatal(err)
	}
	return loc
}
