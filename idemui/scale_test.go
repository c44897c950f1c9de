package idemui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemui"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/workflow"
)

// The runs list at scale: a table of a million runs, made in one INSERT from generate_series,
// read by the view with no sequential scan (TestRunsPageAtScale) and within its budget
// (BenchmarkRunsPage).

// scaleRuns is the size of the table, 1,000,000 unless IDEM_UI_RUNS says otherwise.
func scaleRuns(t testing.TB) int {
	n := 1_000_000
	if v := os.Getenv("IDEM_UI_RUNS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err, "IDEM_UI_RUNS")
	}
	return n
}

// bigFixture fills idem_runs with n runs over n seconds up to now: 1 % failed, 0.5 % running,
// 0.2 % awaiting, 0.1 % cancelled, the rest done, of five workflows in 1,000 scopes, one in ten
// with an attribute; then VACUUM ANALYZE, as autovacuum would have left a table that size.
func bigFixture(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	// The table's indexes are built once after the rows are in, rather than kept up to date
	// through a million inserts, and the table writes no WAL (UNLOGGED): a throwaway table
	// reads the same, and is made several times faster.
	var names, defs []string
	rows, err := pool.Query(ctx, `SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'idem_runs' AND indexname <> 'idem_runs_pkey'`)
	require.NoError(t, err)
	for rows.Next() {
		var name, def string
		require.NoError(t, rows.Scan(&name, &def))
		names, defs = append(names, name), append(defs, def)
	}
	require.NoError(t, rows.Err())
	for _, name := range names {
		_, err := pool.Exec(ctx, `DROP INDEX `+pgx.Identifier{name}.Sanitize())
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `ALTER TABLE idem_runs DROP CONSTRAINT idem_runs_pkey`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ALTER TABLE idem_runs SET UNLOGGED`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
INSERT INTO idem_runs (scope, id, workflow, state, input, output, attempts, created_at, updated_at, finished_at, expires_at, attributes,
	lease_owner, lease_expires_at)
SELECT 'customer:' || (g % 1000), 'r-' || g, (ARRAY['payout', 'refund', 'transfer', 'invoice', 'notify'])[1 + g % 5], s.state,
	convert_to('{"amount":' || g || ',"currency":"EUR"}', 'UTF8'),
	CASE WHEN s.state = 'done' THEN convert_to('{"status":"settled"}', 'UTF8') WHEN s.state IN ('failed', 'cancelled')
		THEN convert_to('{"error":"card declined"}', 'UTF8') END,
	1, c.at, c.at, CASE WHEN s.finished THEN c.at END, CASE WHEN s.finished THEN c.at + interval '30 days' END,
	CASE WHEN g % 10 = 0 THEN jsonb_build_object('customer', 'c-' || (g % 5000)) END,
	CASE WHEN s.state = 'running' THEN 'host:1' END, CASE WHEN s.state = 'running' THEN now() + interval '30 seconds' END
FROM generate_series(1, $1::int) g,
	LATERAL (SELECT now() - ($1::int - g) * interval '1 second' AS at) c,
	LATERAL (SELECT st AS state, st IN ('done', 'failed', 'cancelled') AS finished FROM (SELECT CASE
		WHEN g % 100 = 0 THEN 'failed' WHEN g % 200 = 1 THEN 'running' WHEN g % 500 = 2 THEN 'awaiting'
		WHEN g % 1000 = 3 THEN 'cancelled' ELSE 'done' END AS st) x) s`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ALTER TABLE idem_runs ADD CONSTRAINT idem_runs_pkey PRIMARY KEY (scope, id)`)
	require.NoError(t, err)
	for _, def := range defs {
		_, err := pool.Exec(ctx, def)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `VACUUM ANALYZE idem_runs`)
	require.NoError(t, err)
	t.Logf("%d runs made in %s", n, time.Since(start).Round(time.Millisecond))
}

// recorder keeps the statements a pool sends, for EXPLAIN.
type recorder struct {
	mu    sync.Mutex
	on    bool
	stmts []recorded
}

type recorded struct {
	sql  string
	args []any
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		r.stmts = append(r.stmts, recorded{data.SQL, data.Args})
	}
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *recorder) record(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = on
}

func (r *recorder) take() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stmts
	r.stmts = nil
	return s
}

// scaleBundle is a migrated database with the big fixture, and a view whose statements are
// recorded.
type scaleBundle struct {
	pool    *pgxpool.Pool // plain, for EXPLAIN
	rec     *recorder
	handler *idemui.Handler
	engine  *workflow.Engine
}

func setupScale(t testing.TB) *scaleBundle {
	t.Helper()
	ctx := context.Background()
	url := pgtemp.NewDB(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, idem.Migrate(ctx, pool))
	bigFixture(t, pool, scaleRuns(t))
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	rec := &recorder{}
	cfg.ConnConfig.Tracer = rec
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(traced.Close)
	e, err := workflow.NewEngine(traced, &workflow.Config{Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	h, err := idemui.NewHandler(e, &idemui.Options{Logger: quiet()})
	require.NoError(t, err)
	return &scaleBundle{pool: pool, rec: rec, handler: h, engine: e}
}

// TestRunsPageAtScale reads the runs list over a million runs, first pages and filtered ones,
// and EXPLAINs every statement each page sent, with its arguments: none scans idem_runs (or any
// table) sequentially.
func TestRunsPageAtScale(t *testing.T) {
	t.Parallel()
	b := setupScale(t)
	page := get(t, b.handler, "/runs")
	require.Equal(t, http.StatusOK, page.status, page.body)
	next := strings.ReplaceAll(between(t, page.body, `id="next" href="`, `"`), "&amp;", "&")
	require.Contains(t, page.body, "done <b>~", "done runs, the bulk, are estimated")
	require.Contains(t, page.body, "running <b>", "")

	for _, path := range []string{
		"/runs",
		next,
		"/runs?state=failed",
		"/runs?state=running,awaiting",
		"/runs?state=done",
		"/runs?workflow=refund",
		"/runs?scope=customer:42",
		"/runs?attr=customer%3Dc-40",
		"/runs?since=1h",
		"/runs?workflow=payout&state=failed&limit=200",
	} {
		b.rec.take()
		b.rec.record(true)
		res := get(t, b.handler, path)
		b.rec.record(false)
		require.Equal(t, http.StatusOK, res.status, path)
		require.Contains(t, res.body, `class="run"`, "%s lists runs", path)
		explained := 0
		for _, st := range b.rec.take() {
			if !strings.HasPrefix(strings.TrimSpace(st.sql), "SELECT") {
				continue // the planner's estimates (EXPLAIN), transaction control
			}
			var plan string
			require.NoError(t, b.pool.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+st.sql, st.args...).Scan(&plan), st.sql)
			var nodes []string
			collectNodes(t, plan, &nodes)
			require.NotContains(t, nodes, "Seq Scan", "%s sends\n%s\nplanned as\n%s", path, st.sql, plan)
			explained++
		}
		require.GreaterOrEqual(t, explained, 2, "%s: the list and the counts", path)
	}
}

// collectNodes lists the node types of a JSON plan.
func collectNodes(t testing.TB, plan string, out *[]string) {
	t.Helper()
	var doc []map[string]any
	require.NoError(t, json.Unmarshal([]byte(plan), &doc))
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if s, ok := n["Node Type"].(string); ok {
			*out = append(*out, s)
		}
		if kids, ok := n["Plans"].([]any); ok {
			for _, k := range kids {
				walk(k.(map[string]any))
			}
		}
	}
	for _, d := range doc {
		walk(d["Plan"].(map[string]any))
	}
}

// BenchmarkRunsPage renders pages of the runs list over a million runs (IDEM_UI_RUNS) through
// the whole handler, and reports the p50 and p99 of a request beside the mean. "reads" is the
// first page's two reads alone (RunList and RunCounts, no HTTP, no template), for the ratio of
// what the page adds. The variants share one fixture and run interleaved, in IDEM_UI_ROUNDS
// rounds (3).
func BenchmarkRunsPage(b *testing.B) {
	sb := setupScale(b)
	rounds := 3
	if v := os.Getenv("IDEM_UI_ROUNDS"); v != "" {
		var err error
		rounds, err = strconv.Atoi(v)
		require.NoError(b, err, "IDEM_UI_ROUNDS")
	}
	ctx := context.Background()
	for round := 1; round <= rounds; round++ {
		for _, bc := range []struct{ name, path string }{
			{"first", "/runs"},
			{"reads", ""},
			{"failed", "/runs?state=failed"},
			{"workflow", "/runs?workflow=refund"},
			{"attribute", "/runs?attr=customer%3Dc-40"},
			{"run", "/run?scope=customer:0&id=r-1000"},
		} {
			b.Run(fmt.Sprintf("%s/round=%d", bc.name, round), func(b *testing.B) {
				took := make([]time.Duration, 0, 1024)
				for b.Loop() {
					start := time.Now()
					if bc.path == "" {
						if _, err := sb.engine.RunList(ctx, &workflow.RunListParams{Limit: idemui.DefaultPageSize}); err != nil {
							b.Fatal(err)
						}
						if _, err := sb.engine.RunCounts(ctx, 0); err != nil {
							b.Fatal(err)
						}
					} else if res := get(b, sb.handler, bc.path); res.status != http.StatusOK {
						b.Fatalf("%s: %d", bc.path, res.status)
					}
					took = append(took, time.Since(start))
				}
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
			})
		}
	}
}
