package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// startRecommendedRiver starts a River client with the settings the README recommends for
// workflows that wait: fetches (and insert notifications, which River throttles by the same
// setting) every 10ms rather than 100ms, and a poll for due scheduled jobs every 100ms rather
// than every second. IDEM_RIVER_DEFAULTS=1 leaves River's defaults instead, for comparison.
func (b *testBundle) startRecommendedRiver(t testing.TB, e *workflow.Engine) *river.Client[pgx.Tx] {
	t.Helper()
	workers := river.NewWorkers()
	require.NoError(t, e.AddWorkers(workers))
	cfg := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
		Workers:           workers,
		PeriodicJobs:      e.PeriodicJobs(),
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 100 * time.Millisecond,
		Logger:            quietLogger(),
	}
	if os.Getenv("IDEM_RIVER_DEFAULTS") == "1" {
		cfg.FetchCooldown, cfg.FetchPollInterval = 0, 0
	}
	client, err := river.NewClient(riverpgxv5.New(b.pool), cfg)
	require.NoError(t, err)
	e.SetClient(client)
	require.NoError(t, client.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.StopAndCancel(ctx)
	})
	return client
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkWaitingRuns starts IDEM_WAITING_RUNS runs (default 10,000), half of them sleeping an
// hour and half awaiting a signal, and reports what they hold once all are waiting: goroutines
// beyond those before the runs, pool connections in use, River jobs running. It runs once,
// whatever b.N. IDEM_DUMP_GOROUTINES=1 prints the goroutines at the end, to see whose the few
// that remain are (River's leader-only maintenance services, which start after the count
// before the runs, and the pool's health check: none per run).
//
//	go test -run '^$' -bench WaitingRuns -benchtime 1x ./workflow/
func BenchmarkWaitingRuns(b *testing.B) {
	tb := setup(b)
	n := envInt("IDEM_WAITING_RUNS", 10_000)
	wf := workflow.Define("parked", func(ctx context.Context, i int) (int, error) {
		if _, err := steps.Tx(ctx, "open", func(ctx context.Context, tx pgx.Tx) (int, error) { return i, nil }, nil); err != nil {
			return 0, err
		}
		if i%2 == 0 {
			return i, steps.Sleep(ctx, "nap", time.Hour)
		}
		return steps.Await[int](ctx, "wait", "go", 0)
	})
	e := tb.engine(b, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quietLogger()})
	tb.startRecommendedRiver(b, e)
	time.Sleep(200 * time.Millisecond) // let River's own goroutines start
	before := runtime.NumGoroutine()

	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 64 {
				_, err := wf.Run(tb.ctx, e, idem.Key{Scope: "bench", ID: strconv.Itoa(i)}, i, nil)
				if !errors.Is(err, idem.ErrInFlight) {
					errs <- fmt.Errorf("run %d did not suspend: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	runtime.GC()
	time.Sleep(100 * time.Millisecond) // let finished goroutines exit
	waiting := tb.count(b, `SELECT count(*) FROM idem_runs WHERE state IN ('sleeping', 'awaiting') AND lease_token IS NULL`)
	require.Equal(b, n, waiting)
	b.ReportMetric(float64(runtime.NumGoroutine()-before), "goroutines")
	if os.Getenv("IDEM_DUMP_GOROUTINES") != "" {
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
	}
	b.ReportMetric(float64(tb.pool.Stat().AcquiredConns()), "conns-in-use")
	b.ReportMetric(float64(tb.count(b, `SELECT count(*) FROM river_job WHERE state = 'running'`)), "running-jobs")
	b.ReportMetric(float64(n)/elapsed.Seconds(), "runs-suspended/s")
	b.ReportMetric(float64(waiting), "waiting-runs")
}

// percentile returns the p-th percentile of ds (sorted in place).
func percentile(ds []time.Duration, p float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

// BenchmarkSignalToAwait measures the time from a signal's COMMIT to the await that was waiting
// for it returning in the workflow, with the run suspended before each signal (so each is a
// full wake-up: River job, new lease, replay), on the recommended River settings. It reports
// p50 and p99 over IDEM_SIGNALS signals (default 200), whatever b.N.
//
//	go test -run '^$' -bench SignalToAwait -benchtime 1x ./workflow/
func BenchmarkSignalToAwait(b *testing.B) {
	tb := setup(b)
	n := envInt("IDEM_SIGNALS", 200)
	type ret struct {
		i  int
		at time.Time
	}
	returned := make(chan ret, 1024)
	wf := workflow.Define("ping", func(ctx context.Context, n int) (int, error) {
		for i := range n {
			if _, err := steps.Await[int](ctx, fmt.Sprintf("ping-%d", i), "ping", 0); err != nil {
				return 0, err
			}
			// Outside any step, on purpose: the measurement, not an effect. A wake-up replays
			// the awaits before this one too; the reader skips those.
			select {
			case returned <- ret{i, time.Now()}:
			default:
			}
		}
		return n, nil
	})
	e := tb.engine(b, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quietLogger()})
	tb.startRecommendedRiver(b, e)
	key := idem.Key{Scope: "bench", ID: "ping"}
	_, err := wf.Run(tb.ctx, e, key, n, nil)
	require.ErrorIs(b, err, idem.ErrInFlight)

	var lat []time.Duration
	b.ResetTimer()
	for i := range n {
		eventually(b, 20*time.Second, "the run to await", func() bool {
			return tb.count(b, `SELECT count(*) FROM idem_runs WHERE state = 'awaiting' AND wait_seq = $1`, i+1) == 1
		})
		t, err := tb.pool.Begin(tb.ctx)
		require.NoError(b, err)
		_, err = e.SignalTx(tb.ctx, t, key, "ping", i, nil)
		require.NoError(b, err)
		require.NoError(b, t.Commit(tb.ctx))
		committed := time.Now()
		for got := false; !got; {
			select {
			case r := <-returned:
				if r.i == i {
					lat = append(lat, r.at.Sub(committed))
					got = true
				}
			case <-time.After(20 * time.Second):
				b.Fatalf("signal %d was not received", i)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
}

// BenchmarkSleepLateness starts IDEM_SLEEPERS runs (default 20), 150ms apart, that sleep 2s,
// and reports how late each woke: from its start plus 2s to the sleep returning in the
// workflow (an upper bound: the sleep's own clock starts a little after the run's), p50 and
// max, whatever b.N.
//
//	go test -run '^$' -bench SleepLateness -benchtime 1x ./workflow/
func BenchmarkSleepLateness(b *testing.B) {
	tb := setup(b)
	n := envInt("IDEM_SLEEPERS", 20)
	var mu sync.Mutex
	woke := map[int]time.Time{}
	wf := workflow.Define("napper", func(ctx context.Context, i int) (int, error) {
		if err := steps.Sleep(ctx, "nap", 2*time.Second); err != nil {
			return 0, err
		}
		mu.Lock()
		if _, ok := woke[i]; !ok {
			woke[i] = time.Now()
		}
		mu.Unlock()
		return i, nil
	})
	e := tb.engine(b, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quietLogger()})
	tb.startRecommendedRiver(b, e)
	b.ResetTimer()
	started := make([]time.Time, n)
	for i := range n {
		started[i] = time.Now()
		_, err := wf.Run(tb.ctx, e, idem.Key{Scope: "bench", ID: strconv.Itoa(i)}, i, nil)
		require.ErrorIs(b, err, idem.ErrInFlight)
		time.Sleep(150 * time.Millisecond)
	}
	eventually(b, 30*time.Second, "every sleeper to wake", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(woke) == n
	})
	b.StopTimer()
	var late []time.Duration
	for i := range n {
		late = append(late, woke[i].Sub(started[i].Add(2*time.Second)))
	}
	b.ReportMetric(float64(percentile(late, 0.50).Microseconds())/1000, "p50-late-ms")
	b.ReportMetric(float64(percentile(late, 1).Microseconds())/1000, "max-late-ms")
}
