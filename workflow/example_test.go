package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// examplePool returns a pool on a fresh database with idem, River and an accounts table.
func examplePool(ctx context.Context) *pgxpool.Pool {
	pool := idemtest.NewExamplePool(&idemtest.Opts{River: true})
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL, held int NOT NULL DEFAULT 0);
INSERT INTO accounts VALUES ('alice', 100)`); err != nil {
		log.Fatal(err)
	}
	return pool
}

type PayoutReq struct {
	Account string
	Amount  int
}

type Receipt struct {
	Account string
	Charge  string
	Balance int
}

type NotifyArgs struct{ Account string }

func (NotifyArgs) Kind() string { return "notify" }

// psp stands for a payment provider that honours idempotency keys.
var psp = struct {
	mu      sync.Mutex
	charges map[string]string
}{charges: map[string]string{}}

func charge(_ context.Context, key string, amount int) (string, error) {
	psp.mu.Lock()
	defer psp.mu.Unlock()
	if id, ok := psp.charges[key]; ok {
		return id, nil // a retry: the same charge
	}
	id := fmt.Sprintf("ch_%d", len(psp.charges)+1)
	psp.charges[key] = id
	return id, nil
}

// A payout reserves money in Postgres, charges a payment provider, queues a notification and
// settles. Each step is a recovery point; a retry with the same key replays the receipt.
func Example() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	payout := workflow.Define("payout", func(ctx context.Context, req PayoutReq) (Receipt, error) {
		if _, err := steps.Tx(ctx, "reserve", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, `UPDATE accounts SET held = held + $2 WHERE id = $1`, req.Account, req.Amount)
			return req.Amount, err
		}, nil); err != nil {
			return Receipt{}, err
		}
		chargeID, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (string, error) {
			return charge(ctx, key, req.Amount) // key is the same on every retry and resume
		}, &steps.Opts{MaxAttempts: 5})
		if err != nil {
			return Receipt{}, err
		}
		if err := steps.Enqueue(ctx, "notify", NotifyArgs{Account: req.Account}, nil, nil); err != nil {
			return Receipt{}, err
		}
		return steps.Tx(ctx, "settle", func(ctx context.Context, tx pgx.Tx) (Receipt, error) {
			r := Receipt{Account: req.Account, Charge: chargeID}
			err := tx.QueryRow(ctx, `UPDATE accounts SET balance = balance - $2, held = held - $2 WHERE id = $1 RETURNING balance`,
				req.Account, req.Amount).Scan(&r.Balance)
			return r, err
		}, nil)
	})

	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{payout}})
	if err != nil {
		log.Fatal(err)
	}
	// One River client for the application's jobs and the engine's.
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[NotifyArgs]) error { return nil }))
	if err := engine.AddWorkers(workers); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:      workers,
		PeriodicJobs: engine.PeriodicJobs(),
	})
	if err != nil {
		log.Fatal(err)
	}
	engine.SetClient(client) // (a real program also calls client.Start)

	key := idem.Key{Scope: "merchant:7", ID: "payout-2026-11-21-001"}
	for range 2 {
		r, err := payout.Run(ctx, engine, key, PayoutReq{Account: "alice", Amount: 30}, nil)
		fmt.Println(r, err)
	}
	_, err = payout.Run(ctx, engine, key, PayoutReq{Account: "alice", Amount: 99}, nil)
	fmt.Println(errors.Is(err, idem.ErrMismatch))

	// Output:
	// {alice ch_1 70} <nil>
	// {alice ch_1 70} <nil>
	// true
}

// A reconcile hook decides what becomes of runs that cannot be resumed.
func ExampleReconcileFunc() {
	cfg := &workflow.Config{
		MaxAttempts: 5,
		Reconcile: func(ctx context.Context, run *workflow.StuckRun) (workflow.Decision, error) {
			switch {
			case run.Reason == workflow.ReasonUnregistered:
				return workflow.ResumeLater(time.Hour), nil // a rollout may still bring the code
			case run.RecoveryPoint == "charge":
				// The charge went through; settling is safe to do by hand later.
				return workflow.Complete(Receipt{Charge: "see " + run.StepKey(2, "charge")}), nil
			default:
				return workflow.Fail(fmt.Errorf("gave up after %d attempts: %s", run.Attempts, run.LastError)), nil
			}
		},
	}
	fmt.Println(cfg.MaxAttempts)
	// Output: 5
}

// RunOpts.Wait turns "in flight" into waiting for the other caller's result.
func ExampleWorkflow_Run_wait() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	slow := workflow.Define("slow", func(ctx context.Context, n int) (int, error) {
		return steps.Call(ctx, "compute", func(ctx context.Context, key string) (int, error) {
			once.Do(func() { close(started) })
			<-release // a slow outside call
			return n * 2, nil
		}, nil)
	})
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{slow}})
	if err != nil {
		log.Fatal(err)
	}
	key := idem.Key{Scope: "s", ID: "k"}
	go func() { _, _ = slow.Run(ctx, engine, key, 21, nil) }()
	<-started // the first call is now in the middle of the run

	_, err = slow.Run(ctx, engine, key, 21, nil)
	var inflight *idem.InFlightError
	fmt.Println(errors.As(err, &inflight))

	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	n, err := slow.Run(ctx, engine, key, 21, &workflow.RunOpts{Wait: 5 * time.Second})
	fmt.Println(n, err)
	// Output:
	// true
	// 42 <nil>
}
