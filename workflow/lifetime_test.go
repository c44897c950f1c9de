package workflow_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/workflow"
)

// stmtCounter counts the statements a pool sends whose text contains each of its needles.
type stmtCounter struct {
	mu      sync.Mutex
	needles []string
	counts  map[string]int
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.needles {
		if strings.Contains(data.SQL, n) {
			c.counts[n]++
		}
	}
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *stmtCounter) count(needle string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[needle]
}

// The statements that tell an engine's background work apart: one RunNextExpiry per recovery
// scan, one RunCountByState per collection of the gauge of runs by state.
const (
	scanStmt  = "min(lease_expires_at)"
	gaugeStmt = "GROUP BY state"
)

// countedPool opens a pool on url whose statements c counts.
func countedPool(t *testing.T, url string, c *stmtCounter) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestEngineClose: an engine that is closed stops reporting its gauge (its callback is
// unregistered, so a collection no longer reads the database for it nor reports its runs) and
// stops its recovery scan, while an engine beside it on the same providers goes on with both.
// Engines created and dropped (per tenant, per test) leave nothing running.
func TestEngineClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO idem_runs (scope, id, workflow, state) VALUES ('s', 'k', 'w', 'failed')`)
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	newEngine := func(schema string) (*workflow.Engine, *stmtCounter) {
		if schema != "" {
			require.NoError(t, idem.Migrate(b.ctx, b.pool, idem.Schema(schema)))
			_, err := b.pool.Exec(b.ctx, `INSERT INTO `+pgx.Identifier{schema, "idem_runs"}.Sanitize()+` (scope, id, workflow, state) VALUES ('s', 'k', 'w', 'failed')`)
			require.NoError(t, err)
		}
		c := &stmtCounter{needles: []string{scanStmt, gaugeStmt}, counts: map[string]int{}}
		pool := countedPool(t, b.url, c)
		cfg := fastConfig()
		cfg.Schema, cfg.MeterProvider = schema, mp
		e, err := workflow.NewEngine(pool, cfg)
		require.NoError(t, err)
		require.NoError(t, e.AddWorkers(river.NewWorkers()))
		client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger()})
		require.NoError(t, err)
		e.SetClient(client) // starts the engine's recovery scan
		return e, c
	}
	closed, closedCount := newEngine("")
	open, openCount := newEngine("tenant_b")
	t.Cleanup(func() { require.NoError(t, open.Close()) })

	// schemas collects the gauge and returns the schemas it reported runs of.
	schemas := func() []string {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(b.ctx, &rm))
		var got []string
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != "idem.workflow.runs" {
					continue
				}
				for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					s, _ := dp.Attributes.Value("idem.schema")
					got = append(got, s.AsString())
				}
			}
		}
		return got
	}
	require.ElementsMatch(t, []string{"", "tenant_b"}, schemas())
	eventually(t, 10*time.Second, "both engines to scan", func() bool { return closedCount.count(scanStmt) > 0 && openCount.count(scanStmt) > 0 })

	require.NoError(t, closed.Close())
	require.NoError(t, closed.Close(), "a second Close does nothing")
	gauges, scans := closedCount.count(gaugeStmt), closedCount.count(scanStmt)
	require.Equal(t, []string{"tenant_b"}, schemas(), "the closed engine's callback is unregistered")
	require.Equal(t, gauges, closedCount.count(gaugeStmt), "and reads nothing")

	// The open engine scans every ScanInterval (1s); three more of its scans take at least two
	// intervals, in which the closed one, were it scanning, would have scanned too.
	from := openCount.count(scanStmt)
	eventually(t, 15*time.Second, "three more scans of the open engine", func() bool { return openCount.count(scanStmt) >= from+3 })
	require.Equal(t, scans, closedCount.count(scanStmt), "the closed engine's scan stopped")
	require.Equal(t, []string{"tenant_b"}, schemas())
}

// TestMissingTables: on a database where idem.Migrate never ran, every way in (reads, admin
// operations, starts, signals, the engine's own scan and gauge) says to run idem.Migrate
// instead of giving Postgres's "relation does not exist".
func TestMissingTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtemp.NewDB(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	wf := workflow.Define("w", func(ctx context.Context, in int) (int, error) { return in, nil })
	var logs syncBuffer
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	cfg := fastConfig(wf)
	cfg.Logger, cfg.MeterProvider = slog.New(slog.NewTextHandler(&logs, nil)), mp
	e, err := workflow.NewEngine(pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	require.NoError(t, e.AddWorkers(river.NewWorkers()))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger()})
	require.NoError(t, err)
	e.SetClient(client)

	key := idem.Key{Scope: "s", ID: "k"}
	inTx := func(f func(t pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, f) }
	for name, call := range map[string]func() error{
		"RunGet":  func() error { _, err := e.RunGet(ctx, key); return err },
		"RunList": func() error { _, err := e.RunList(ctx, nil); return err },
		"EventGet": func() error {
			_, err := e.EventGet(ctx, key, "status", 0)
			return err
		},
		"Get":     func() error { _, err := wf.Get(ctx, e, key); return err },
		"Run":     func() error { _, err := wf.Run(ctx, e, key, 1, nil); return err },
		"StartTx": func() error { return inTx(func(t pgx.Tx) error { return wf.StartTx(ctx, e, t, key, 1) }) },
		"SignalTx": func() error {
			return inTx(func(t pgx.Tx) error { _, err := e.SignalTx(ctx, t, key, "go", 1, nil); return err })
		},
		"RunCancel": func() error { return e.RunCancel(ctx, key, "") },
		"RunResume": func() error { return e.RunResume(ctx, key) },
		"RunFork":   func() error { return e.RunFork(ctx, key, idem.Key{Scope: "s", ID: "k2"}, 1) },
	} {
		err := call()
		require.ErrorContains(t, err, "idem's tables are missing: run idem.Migrate", name)
	}
	eventually(t, 10*time.Second, "the scan to fail", func() bool { return strings.Contains(logs.String(), "recovery scan failed") })
	require.Contains(t, logs.String(), "run idem.Migrate", "the scan's warning says what to do")
	var rm metricdata.ResourceMetrics
	err = reader.Collect(ctx, &rm)
	require.ErrorContains(t, err, "run idem.Migrate", "so does the gauge's callback")
}
