package idemriver_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemriver"
	"github.com/idemkit/idem/idemtest"
)

func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }

// TestReapJob runs the reap job as an application without the workflow engine would: its
// periodic job deletes expired keys of Do and leaves the others.
func TestReapJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := idemtest.NewPool(t, &idemtest.Opts{River: true})
	_, err := pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, result, expires_at)
		SELECT 's', 'expired-' || i, '1', now() - interval '1 second' FROM generate_series(1, 50) i`)
	require.NoError(t, err)
	live := idem.Key{Scope: "s", ID: "live"}
	_, err = idem.Run(ctx, pool, live, func(context.Context, pgx.Tx) (int, error) { return 1, nil })
	require.NoError(t, err)

	cfg := &idemriver.ReapConfig{Interval: time.Second}
	workers := river.NewWorkers()
	require.NoError(t, idemriver.AddReapWorker(workers, pool, cfg))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Workers:      workers,
		PeriodicJobs: []*river.PeriodicJob{idemriver.ReapPeriodicJob(cfg)},
		TestOnly:     true,
	})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { _ = client.Stop(context.Background()) })

	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys`).Scan(&n))
		if n == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the reap job did not delete the expired keys (%d keys left)", n)
		time.Sleep(50 * time.Millisecond)
	}
	var id string
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM idem_keys`).Scan(&id))
	require.Equal(t, "live", id, "a live key stays")
}

func TestReapConfigIsChecked(t *testing.T) {
	t.Parallel()
	workers := river.NewWorkers()
	pool := idemtest.NewPool(t, nil)
	err := idemriver.AddReapWorker(workers, pool, &idemriver.ReapConfig{Interval: time.Millisecond})
	require.ErrorContains(t, err, "ReapConfig.Interval cannot be less than one second")
	err = idemriver.AddReapWorker(workers, pool, &idemriver.ReapConfig{Options: []idem.Option{idem.ReapBusy(2)}})
	require.ErrorContains(t, err, "ReapBusy")
	require.ErrorContains(t, idemriver.AddReapWorker(nil, pool, nil), "needs workers")
	require.NoError(t, idemriver.AddReapWorker(workers, pool, nil))
	require.Error(t, idemriver.AddReapWorker(workers, pool, nil), "a kind registers once")
}
