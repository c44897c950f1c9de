package browsertest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemui"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

// chromium finds the browser: IDEM_CHROMIUM, or Debian's chromium on PATH. There is no
// skipping: without one the test fails and says what to install.
func chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("IDEM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found for the browser tests: install Debian's chromium package (apt-get install -y chromium; .ci/run does), " +
		"or set IDEM_CHROMIUM to a Chromium or Chrome binary")
	return ""
}

// browser starts a headless Chromium of its own (an empty profile, none of its own network
// traffic, which a closed network refuses) and returns a tab's context. When the test fails,
// the tab's last page is saved as a PNG (quality 100 is PNG) in a directory that outlives the test, named in the log.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	require.NoError(t, chromedp.Do(ctx), "starting %s", chromium(t))
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		dir, err := os.MkdirTemp("", "idemui-browser-")
		if err != nil {
			t.Logf("no screenshot: %v", err)
			return
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Logf("no screenshot: %v", err)
			return
		}
		path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Logf("no screenshot: %v", err)
			return
		}
		t.Logf("screenshot of the page at the failure: %s", path)
	})
	return ctx
}

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	engine *workflow.Engine
	gates  map[string]chan struct{} // a step of the stepper workflow waits until its gate closes
	wf     *workflow.Workflow[string, string]
}

// stepper runs three steps, each a Call that waits for its gate, so that the test decides when
// the run advances.
func (b *testBundle) stepper() *workflow.Workflow[string, string] {
	return workflow.Define("stepper", func(ctx context.Context, in string) (string, error) {
		for _, name := range []string{"prepare", "charge", "settle"} {
			gate := b.gates[name]
			if _, err := steps.Call(ctx, name, func(ctx context.Context, _ string) (string, error) {
				select {
				case <-gate:
					return name + " ok", nil
				case <-ctx.Done():
					return "", ctx.Err()
				}
			}, &steps.Opts{CheckpointNow: true}); err != nil { // each step visible as it completes
				return "", err
			}
		}
		return "done " + in, nil
	})
}

// setup makes a database, a live engine with a River client working its jobs, and a few runs.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	require.NoError(t, idem.Migrate(ctx, pool))
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)
	b := &testBundle{ctx: ctx, pool: pool, gates: map[string]chan struct{}{}}
	for _, name := range []string{"prepare", "charge", "settle"} {
		b.gates[name] = make(chan struct{})
	}
	quick := workflow.Define("quick", func(ctx context.Context, n int) (int, error) {
		return steps.Tx(ctx, "only", func(ctx context.Context, tx pgx.Tx) (int, error) { return n * 2, nil }, nil)
	})
	b.wf = b.stepper()
	e, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{b.wf, quick}, Lease: 2 * time.Second,
		ScanInterval: time.Second, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	b.engine = e
	workers := river.NewWorkers()
	require.NoError(t, e.AddWorkers(workers))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:           workers,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
		TestOnly:          true,
	})
	require.NoError(t, err)
	e.SetClient(client)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		for _, g := range b.gates {
			select {
			case <-g:
			default:
				close(g)
			}
		}
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.StopAndCancel(sctx)
		_ = e.Close()
	})
	for i := range 3 {
		_, err := quick.Run(ctx, e, idem.Key{Scope: "shop:1", ID: fmt.Sprintf("q-%d", i)}, i, nil)
		require.NoError(t, err)
	}
	return b
}

func (b *testBundle) state(t *testing.T, key idem.Key) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT state FROM idem_runs WHERE scope = $1 AND id = $2`, key.Scope, key.ID).Scan(&s))
	return s
}

// serve serves a handler of the engine with opts on a local port.
func (b *testBundle) serve(t *testing.T, opts *idemui.Options) string {
	t.Helper()
	opts.Logger = slog.New(slog.DiscardHandler)
	h, err := idemui.NewHandler(b.engine, opts)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestBrowser drives the view in a real Chromium against a live engine: the runs list,
// filtering it, a run whose steps advance while its page is open, cancelling it, and a
// read-only view that refuses.
func TestBrowser(t *testing.T) {
	b := setup(t)
	key := idem.Key{Scope: "shop:1", ID: "order-7"}
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		return b.wf.StartTx(b.ctx, b.engine, tx, key, "order 7")
	}))
	close(b.gates["prepare"])
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_steps WHERE id = 'order-7'`).Scan(&n))
		if n == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the run's first step completes")
		time.Sleep(20 * time.Millisecond)
	}
	ctx := browser(t)

	t.Run("ListAndFilter", func(t *testing.T) {
		base := b.serve(t, &idemui.Options{})
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/runs"), chromedp.WaitVisible(chromedp.CSS("#runs"))))
		rows := run(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("#runs a.run").length`))
		require.Equal(t, 4, rows, "three quick runs and the stepper")
		counts := run(t, ctx, chromedp.Text(chromedp.CSS("#counts")))
		require.Contains(t, counts, "running 1")
		require.Contains(t, counts, "done 3")

		require.NoError(t, chromedp.Do(ctx,
			chromedp.SetValue(chromedp.CSS("#filters select[name=state]"), "running"),
			chromedp.SendKeys(chromedp.CSS("#filters input[name=workflow]"), "stepper"),
			chromedp.Submit(chromedp.CSS("#filters")),
		))
		waitFor(t, ctx, `location.search.includes("state=running") && document.querySelector("#runs") !== null`)
		ids := run(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#runs a.run")].map(a => a.textContent)`))
		require.Equal(t, []string{"order-7"}, ids)
		require.Contains(t, run(t, ctx, chromedp.Location()), "workflow=stepper")
	})

	t.Run("StepsAdvanceThenCancel", func(t *testing.T) {
		base := b.serve(t, &idemui.Options{AllowActions: true, User: func(*http.Request) string { return "browser" }})
		require.NoError(t, chromedp.Do(ctx,
			chromedp.Navigate(base+"/runs?workflow=stepper"),
			chromedp.WaitVisible(chromedp.CSS("#runs a.run")),
			chromedp.Click(chromedp.CSS("#runs a.run")),
			chromedp.WaitVisible(chromedp.CSS("#steps")),
		))
		seqs := run(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#steps tr.step")].map(r => r.dataset.seq)`))
		require.Equal(t, []string{"1"}, seqs, "one step completed when the page opened")

		// The page reloads its content while the run works: the next step appears without a
		// navigation.
		close(b.gates["charge"])
		require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#steps tr[data-seq="2"]`))))
		require.Equal(t, "running", run(t, ctx, chromedp.Text(chromedp.CSS("#state"))))
		require.Contains(t, run(t, ctx, chromedp.Location()), "/run?", "no navigation")

		require.NoError(t, chromedp.Do(ctx,
			chromedp.Click(chromedp.CSS("#actions a.danger")),
			chromedp.WaitVisible(chromedp.CSS("#confirm")),
			chromedp.SendKeys(chromedp.CSS("#confirm input[name=reason]"), "customer changed their mind"),
			chromedp.Click(chromedp.CSS("#confirm button[type=submit]")),
			chromedp.WaitVisible(chromedp.CSS("p.done")),
		))
		require.Equal(t, "The run was cancelled.", run(t, ctx, chromedp.Text(chromedp.CSS("p.done"))))
		require.Equal(t, "cancelled", run(t, ctx, chromedp.Text(chromedp.CSS("#state"))))
		require.Equal(t, "cancelled", b.state(t, key), "cancelled in the database")
	})

	t.Run("ReadOnlyRefuses", func(t *testing.T) {
		other := idem.Key{Scope: "shop:1", ID: "q-1"}
		base := b.serve(t, &idemui.Options{})
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/run?scope=shop:1&id=q-1"), chromedp.WaitVisible(chromedp.CSS("#summary"))))
		require.Zero(t, run(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("#actions, a[href*='/confirm']").length`)), "no button to act")
		require.Equal(t, "read-only", run(t, ctx, chromedp.Text(chromedp.CSS("header .mode"))))

		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/confirm?action=fork&scope=shop:1&id=q-1"),
			chromedp.WaitVisible(chromedp.CSS("#problem"))))
		require.Contains(t, run(t, ctx, chromedp.Text(chromedp.CSS("#problem"))), "actions are off in this view")

		// A form posted at it anyway, from the page itself, is refused.
		status := run(t, ctx, chromedp.Evaluate[int](`fetch("/action", {method: "POST", body: new URLSearchParams(`+
			`{action: "cancel", scope: "shop:1", id: "q-1", reason: "x", csrf: "forged"})}).then(r => r.status)`, chromedp.EvalAwaitPromise))
		require.Equal(t, 403, status)
		require.Equal(t, "done", b.state(t, other), "nothing changed")
	})
}

// run runs one action that returns a value, and fails the test on an error.
func run[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	require.NoError(t, err)
	return v
}

// waitFor waits until a JavaScript condition holds in the page. It asks again and again rather
// than polling in the page, whose context a navigation destroys.
func waitFor(t *testing.T, ctx context.Context, cond string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](cond))
		if err == nil && ok {
			return
		}
		require.True(t, time.Now().Before(deadline), "waiting until %s (last error: %v)", cond, err)
		time.Sleep(50 * time.Millisecond)
	}
}
