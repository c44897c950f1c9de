package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// provider stands for an outside service that is down until it is fixed.
var providerDown atomic.Bool

// signup is the workflow of the operator examples: two calls to the outside world.
var signup = workflow.Define("signup", func(ctx context.Context, email string) (string, error) {
	account, err := steps.Call(ctx, "create-account", func(ctx context.Context, key string) (string, error) {
		return "acct-" + strings.Split(email, "@")[0], nil
	}, nil)
	if err != nil {
		return "", err
	}
	return steps.Call(ctx, "send-welcome", func(ctx context.Context, key string) (string, error) {
		if providerDown.Load() {
			return "", steps.Permanent(errors.New("mail provider is down"))
		}
		return account + " welcomed", nil
	}, nil)
})

// exampleEngine is an engine for signup with a started River client, as an application has.
func exampleEngine(ctx context.Context, pool *pgxpool.Pool) (*workflow.Engine, func()) {
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{signup}, Logger: quietLogger()})
	if err != nil {
		log.Fatal(err)
	}
	workers := river.NewWorkers()
	if err := engine.AddWorkers(workers); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 5}},
		Workers:           workers,
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	})
	if err != nil {
		log.Fatal(err)
	}
	engine.SetClient(client)
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return engine, func() { _ = client.Stop(ctx) }
}

// waitOutcome polls the run's outcome with Get, which never runs anything, until it is final.
func waitOutcome(ctx context.Context, engine *workflow.Engine, key idem.Key) (string, error) {
	for {
		out, err := signup.Get(ctx, engine, key)
		if !errors.Is(err, idem.ErrInFlight) {
			return out, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ExampleEngine_RunGet() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	engine, stop := exampleEngine(ctx, pool)
	defer stop()

	key := idem.Key{Scope: "tenant:1", ID: "signup-ada"}
	if _, err := signup.Run(ctx, engine, key, "ada@example.com", nil); err != nil {
		log.Fatal(err)
	}
	run, err := engine.RunGet(ctx, key)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Workflow, run.State, string(run.Output))
	for _, s := range run.Steps {
		fmt.Println(s.Seq, s.Kind, s.Name, string(s.Output))
	}
	// Output:
	// signup done "acct-ada welcomed"
	// 1 call create-account "acct-ada"
	// 2 call send-welcome "acct-ada welcomed"
}

func ExampleEngine_RunList() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	engine, stop := exampleEngine(ctx, pool)
	defer stop()

	for _, name := range []string{"ada", "bob", "cy"} {
		key := idem.Key{Scope: "tenant:1", ID: "signup-" + name}
		if _, err := signup.Run(ctx, engine, key, name+"@example.com", nil); err != nil {
			log.Fatal(err)
		}
	}
	params := &workflow.RunListParams{Workflows: []string{"signup"}, Limit: 2}
	for {
		res, err := engine.RunList(ctx, params)
		if err != nil {
			log.Fatal(err)
		}
		for _, run := range res.Runs {
			fmt.Println(run.ID, run.State)
		}
		if res.Next == "" {
			break
		}
		params.After = res.Next
	}
	// Output:
	// signup-cy done
	// signup-bob done
	// signup-ada done
}

func ExampleWorkflow_Get() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	engine, stop := exampleEngine(ctx, pool)
	defer stop()

	key := idem.Key{Scope: "tenant:1", ID: "signup-ada"}
	_, err := signup.Get(ctx, engine, key)
	fmt.Println("before:", errors.Is(err, idem.ErrNotFound))

	// Started in the background; Get reports it in flight until it is done, and never runs it.
	err = pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error { return signup.StartTx(ctx, engine, t, key, "ada@example.com") })
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(waitOutcome(ctx, engine, key))
	// Output:
	// before: true
	// acct-ada welcomed <nil>
}

func ExampleEngine_RunCancel() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{signup}, Logger: quietLogger()})
	if err != nil {
		log.Fatal(err)
	}
	// A client that only inserts: the run waits for a worker that this example never starts.
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		log.Fatal(err)
	}
	engine.SetClient(client)

	key := idem.Key{Scope: "tenant:1", ID: "signup-eve"}
	err = pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error { return signup.StartTx(ctx, engine, t, key, "eve@example.com") })
	if err != nil {
		log.Fatal(err)
	}
	if err := engine.RunCancel(ctx, key, "signup looked fraudulent"); err != nil {
		log.Fatal(err)
	}
	fmt.Println(engine.RunCancel(ctx, key, "again")) // already cancelled: nothing to do

	_, err = signup.Run(ctx, engine, key, "eve@example.com", nil)
	var cancelled *workflow.CancelledError
	fmt.Println(errors.As(err, &cancelled), cancelled.Reason)
	// Output:
	// <nil>
	// true signup looked fraudulent
}

func ExampleEngine_RunResume() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	engine, stop := exampleEngine(ctx, pool)
	defer stop()

	key := idem.Key{Scope: "tenant:1", ID: "signup-bob"}
	providerDown.Store(true)
	_, err := signup.Run(ctx, engine, key, "bob@example.com", nil)
	fmt.Println(err)

	providerDown.Store(false) // the operator fixed the provider
	if err := engine.RunResume(ctx, key); err != nil {
		log.Fatal(err)
	}
	fmt.Println(waitOutcome(ctx, engine, key))
	// Output:
	// workflow "signup" (key "signup-bob" in scope "tenant:1") failed: step "send-welcome" (#2) failed after 1 attempt: mail provider is down
	// acct-bob welcomed <nil>
}

func ExampleEngine_RunFork() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	engine, stop := exampleEngine(ctx, pool)
	defer stop()

	key := idem.Key{Scope: "tenant:1", ID: "signup-cy"}
	if _, err := signup.Run(ctx, engine, key, "cy@example.com", nil); err != nil {
		log.Fatal(err)
	}
	// Send the welcome again, in a run of its own: step 1 is copied, step 2 runs.
	again := idem.Key{Scope: "tenant:1", ID: "signup-cy-rewelcome"}
	if err := engine.RunFork(ctx, key, again, 2); err != nil {
		log.Fatal(err)
	}
	fmt.Println(waitOutcome(ctx, engine, again))
	fmt.Println(errors.Is(engine.RunFork(ctx, key, again, 2), idem.ErrMismatch))
	// Output:
	// acct-cy welcomed <nil>
	// true
}
