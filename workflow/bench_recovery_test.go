package workflow_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// leaderPoint makes the crash helper a process of the application that is River's leader and
// runs a workflow, blocked in a step, until SIGKILL.
const leaderPoint = "leader"

var leaderKey = idem.Key{Scope: "merchant:7", ID: "leader-1"}

// inLeaderChild makes the held workflow block in its step: it is set in the child only.
var inLeaderChild bool

// newHeld is a workflow of one Call step, which blocks in the leader child and returns at once
// anywhere else.
func newHeld() *workflow.Workflow[int, int] {
	return workflow.Define("held", func(ctx context.Context, in int) (int, error) {
		return steps.Call(ctx, "hold", func(ctx context.Context, _ string) (int, error) {
			if inLeaderChild {
				fmt.Println(crashMarker)
				select {} // wait here for SIGKILL
			}
			return in, nil
		}, nil)
	})
}

// recoveryConfig is the engine's configuration in the recovery benchmark: a short lease, and
// the default scan interval, so that what brings a dead process's runs back quickly is each
// engine's scan at the next lease expiry, not a short interval.
func recoveryConfig(wf workflow.Definition) *workflow.Config {
	return &workflow.Config{Workflows: []workflow.Definition{wf}, Lease: 2 * time.Second, Logger: quietLogger()}
}

// startClient starts a River client with the engine's workers, as an application does.
func startClient(ctx context.Context, pool *pgxpool.Pool, e *workflow.Engine) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	if err := e.AddWorkers(workers); err != nil {
		return nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:      workers,
		PeriodicJobs: e.PeriodicJobs(),
		Logger:       quietLogger(),
	})
	if err != nil {
		return nil, err
	}
	e.SetClient(client)
	return client, client.Start(ctx)
}

func runLeaderHelper() int {
	inLeaderChild = true
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(helperDBEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	wf := newHeld()
	e, err := workflow.NewEngine(pool, recoveryConfig(wf))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	client, err := startClient(ctx, pool, e)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// Be River's leader before the run starts: the parent starts its client only then.
	for {
		var leader string
		err := pool.QueryRow(ctx, `SELECT coalesce((SELECT leader_id FROM river_leader), '')`).Scan(&leader)
		if err == nil && leader == client.ID() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err = wf.Run(ctx, e, leaderKey, 1, nil)
	fmt.Fprintf(os.Stderr, "the run ended without blocking: %v\n", err)
	return 3
}

// BenchmarkRecoveryAfterLeaderKill measures how soon a run is resumed after the process running
// it, which is also River's leader, dies with SIGKILL: the time from its lease's expiry to the
// takeover, both by Postgres's clock, once per iteration. The engine of the surviving process
// scans by itself ("engine"); "leader" stops that scan, so that only the periodic job on River's
// leader scans, as before, and its figure includes River's leader failover.
//
//	go test -run '^$' -bench RecoveryAfterLeaderKill -benchtime 10x ./workflow/
func BenchmarkRecoveryAfterLeaderKill(b *testing.B) {
	for _, variant := range []string{"engine", "leader"} {
		b.Run(variant, func(b *testing.B) {
			var latencies []time.Duration
			for range b.N {
				latencies = append(latencies, recoverAfterLeaderKill(b, variant == "leader"))
			}
			slices.Sort(latencies)
			b.ReportMetric(latencies[len(latencies)/2].Seconds(), "p50-s")
			b.ReportMetric(latencies[len(latencies)-1].Seconds(), "max-s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func recoverAfterLeaderKill(b *testing.B, leaderOnly bool) time.Duration {
	tb := setup(b)
	ctx := tb.ctx
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+leaderPoint, helperDBEnv+"="+tb.url)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	reached := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == crashMarker {
				reached <- true
				return
			}
		}
		close(reached)
	}()
	select {
	case ok := <-reached:
		require.True(b, ok, "the child exited before its run blocked")
	case <-time.After(60 * time.Second):
		b.Fatal("the child's run did not block")
	}

	// The surviving process: not River's leader, since the child is.
	wf := newHeld()
	e := tb.engine(b, recoveryConfig(wf))
	client, err := startClient(ctx, tb.pool, e)
	require.NoError(b, err)
	b.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.StopAndCancel(sctx)
	})
	if leaderOnly {
		workflow.StopOwnScan(e)
	}

	require.NoError(b, cmd.Process.Kill())
	_ = cmd.Wait()
	var expired time.Time
	require.NoError(b, tb.pool.QueryRow(ctx, `SELECT lease_expires_at FROM idem_runs`).Scan(&expired))
	var resumed time.Time
	eventually(b, 2*time.Minute, "the run to be taken over", func() bool {
		err := tb.pool.QueryRow(ctx, `SELECT updated_at FROM idem_runs WHERE attempts >= 2`).Scan(&resumed)
		return err == nil
	})
	require.Equal(b, "done", tb.waitFinished(b, leaderKey))
	return resumed.Sub(expired)
}
