package workflow_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper())
	}
	code := pgtemp.Main(m)
	os.Exit(code)
}

type testBundle struct {
	ctx  context.Context
	url  string
	pool *pgxpool.Pool
}

// setup gives each test its own database with idem and River migrated, and tables in which the
// test workflows record what really happened, so that tests count effects instead of trusting
// return values.
func setup(t testing.TB) *testBundle {
	t.Helper()
	ctx := context.Background()
	url := pgtemp.NewDB(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, migrate(ctx, pool))
	return &testBundle{ctx: ctx, url: url, pool: pool}
}

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := idem.Migrate(ctx, pool); err != nil {
		return err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: quietLogger()})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `
CREATE TABLE effects (id bigserial PRIMARY KEY, run text NOT NULL, step text NOT NULL, note text);
CREATE TABLE calls (id bigserial PRIMARY KEY, run text NOT NULL, step text NOT NULL, key text NOT NULL)`)
	return err
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fastConfig is an engine config for tests: leases and scans as short as they may be.
func fastConfig(wfs ...workflow.Definition) *workflow.Config {
	return &workflow.Config{
		Workflows:    wfs,
		Lease:        time.Second,
		ScanInterval: time.Second,
		ReapInterval: time.Second,
		Logger:       quietLogger(),
	}
}

func (b *testBundle) engine(t testing.TB, cfg *workflow.Config) *workflow.Engine {
	t.Helper()
	e, err := workflow.NewEngine(b.pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

// startRiver starts a River client that works the engine's jobs, as an application would, and
// stops it when the test ends.
func (b *testBundle) startRiver(t testing.TB, e *workflow.Engine, register ...func(*river.Workers)) *river.Client[pgx.Tx] {
	t.Helper()
	return b.startRiverPeriodic(t, e, e.PeriodicJobs(), register...)
}

// startRiverPeriodic is startRiver with periodic as the client's periodic jobs.
func (b *testBundle) startRiverPeriodic(t testing.TB, e *workflow.Engine, periodic []*river.PeriodicJob, register ...func(*river.Workers)) *river.Client[pgx.Tx] {
	t.Helper()
	workers := river.NewWorkers()
	require.NoError(t, e.AddWorkers(workers))
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[notifyArgs]) error { return nil }))
	for _, r := range register {
		r(workers)
	}
	client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:           workers,
		PeriodicJobs:      periodic,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
		TestOnly:          true,
	})
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

type notifyArgs struct {
	Run string `json:"run"`
}

func (notifyArgs) Kind() string { return "test_notify" }

// count runs a count(*) query.
func (b *testBundle) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// state returns the run's state and attempts.
func (b *testBundle) state(t testing.TB, key idem.Key) (string, int) {
	t.Helper()
	var state string
	var attempts int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT state, attempts FROM idem_runs WHERE scope = $1 AND id = $2`, key.Scope, key.ID).Scan(&state, &attempts))
	return state, attempts
}

// beforeFirstCommit are the points of the transfer workflow at which nothing of the run has
// committed yet: its row commits with its first step's transaction, which stays open until the
// next step begins.
var beforeFirstCommit = map[string]bool{"before:reserve": true, "in:reserve": true, "before:charge": true}

// requireNoRun asserts that nothing of a run under key is stored, and none of its effects.
func (b *testBundle) requireNoRun(t testing.TB, key idem.Key) {
	t.Helper()
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys WHERE scope = $1 AND id = $2`, key.Scope, key.ID))
	require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects`), "the step's write rolled back with it")
}

// eventually polls cond every 50ms until it holds or timeout passes: the tests wait for the
// database to say something happened, never for a fixed time.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFinished waits for the run to finish: to leave state running, and not to wait.
func (b *testBundle) waitFinished(t testing.TB, key idem.Key) string {
	t.Helper()
	var state string
	eventually(t, 20*time.Second, "run "+key.ID+" to finish", func() bool {
		state, _ = b.state(t, key)
		return state != "running" && state != "sleeping" && state != "awaiting"
	})
	return state
}

// waitLeaseExpired waits until the run's lease has run out by the database's clock.
func (b *testBundle) waitLeaseExpired(t testing.TB, key idem.Key) {
	t.Helper()
	eventually(t, 10*time.Second, "lease of "+key.ID+" to expire", func() bool {
		var expired bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT lease_expires_at <= now() FROM idem_runs WHERE scope = $1 AND id = $2`, key.Scope, key.ID).Scan(&expired))
		return expired
	})
}

// The workflow most tests run: a transaction, an outside call, a transaction.

type transferReq struct {
	Amount int    `json:"amount"`
	Note   string `json:"note"`
}

type receipt struct {
	ReserveID int64  `json:"reserve_id"`
	ChargeKey string `json:"charge_key"`
	SettleID  int64  `json:"settle_id"`
	Amount    int    `json:"amount"`
}

// hooks let a test act at a point of the transfer workflow ("before:charge", "in:settle",
// "end"), in one process only. at is called at each point and may block or cancel.
type hooks struct {
	mu sync.Mutex
	at func(ctx context.Context, point string)
}

func (h *hooks) fire(ctx context.Context, point string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	at := h.at
	h.mu.Unlock()
	if at != nil {
		at(ctx, point)
	}
}

// crashOnceAt returns hooks that cancel the run's context at point the first time it is
// reached: the process "dies" there, leaving the run with its lease.
func crashOnceAt(point string, cancel context.CancelFunc) *hooks {
	var once sync.Once
	return &hooks{at: func(_ context.Context, p string) {
		if p == point {
			once.Do(cancel)
		}
	}}
}

func newTransfer(db workflow.DB, h *hooks) *workflow.Workflow[transferReq, receipt] {
	return workflow.Define("transfer", func(ctx context.Context, req transferReq) (receipt, error) {
		run := req.Note
		h.fire(ctx, "before:reserve")
		reserveID, err := steps.Tx(ctx, "reserve", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO effects (run, step, note) VALUES ($1, 'reserve', $2) RETURNING id`, run, req.Note).Scan(&id)
			h.fire(ctx, "in:reserve")
			return id, err
		}, nil)
		if err != nil {
			return receipt{}, err
		}
		h.fire(ctx, "before:charge")
		chargeKey, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (string, error) {
			// The outside world: recorded on a connection of its own, so it stays even if the
			// step's checkpoint never commits.
			if _, err := db.Exec(context.WithoutCancel(ctx), `INSERT INTO calls (run, step, key) VALUES ($1, 'charge', $2)`, run, key); err != nil {
				return "", err
			}
			h.fire(ctx, "in:charge")
			return key, nil
		}, nil)
		if err != nil {
			return receipt{}, err
		}
		h.fire(ctx, "before:settle")
		r, err := steps.Tx(ctx, "settle", func(ctx context.Context, tx pgx.Tx) (receipt, error) {
			r := receipt{ReserveID: reserveID, ChargeKey: chargeKey, Amount: req.Amount}
			err := tx.QueryRow(ctx, `INSERT INTO effects (run, step, note) VALUES ($1, 'settle', $2) RETURNING id`, run, req.Note).Scan(&r.SettleID)
			h.fire(ctx, "in:settle")
			return r, err
		}, nil)
		if err != nil {
			return receipt{}, err
		}
		h.fire(ctx, "end")
		return r, nil
	})
}

// checkTransfer asserts what a finished transfer must have left: each Tx effect exactly once,
// every charge attempt with the same key, the receipt made of those.
func (b *testBundle) checkTransfer(t testing.TB, r receipt) {
	t.Helper()
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'reserve'`), "reserve must commit exactly once")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'settle'`), "settle must commit exactly once")
	require.GreaterOrEqual(t, b.count(t, `SELECT count(*) FROM calls`), 1)
	require.Equal(t, 1, b.count(t, `SELECT count(DISTINCT key) FROM calls`), "every charge attempt must get the same key")
	var key string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT key FROM calls LIMIT 1`).Scan(&key))
	require.Equal(t, key, r.ChargeKey)
	var reserveID, settleID int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id FROM effects WHERE step = 'reserve'`).Scan(&reserveID))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id FROM effects WHERE step = 'settle'`).Scan(&settleID))
	require.Equal(t, reserveID, r.ReserveID)
	require.Equal(t, settleID, r.SettleID)
}

var errBoom = errors.New("boom")
