package idemui_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
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
	"github.com/idemkit/idem/idemui"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	engine *workflow.Engine
	log    *syncBuffer // the handler's log
}

// syncBuffer is a log's destination that the test reads while the handler writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The test workflows: one that completes in three steps, one whose second step fails for good,
// and one that waits for a signal (so that it can be cancelled).
var (
	payWF = workflow.Define("pay", func(ctx context.Context, amount int) (map[string]any, error) {
		hold, err := steps.Tx(ctx, "reserve", func(ctx context.Context, tx pgx.Tx) (int, error) { return amount, nil }, nil)
		if err != nil {
			return nil, err
		}
		charge, err := steps.Call(ctx, "charge", func(ctx context.Context, key string) (string, error) { return "ch_" + key[:8], nil }, nil)
		if err != nil {
			return nil, err
		}
		return steps.Tx(ctx, "settle", func(ctx context.Context, tx pgx.Tx) (map[string]any, error) {
			return map[string]any{"held": hold, "charge": charge}, nil
		}, nil)
	})
	failWF = workflow.Define("fail", func(ctx context.Context, msg string) (int, error) {
		if _, err := steps.Tx(ctx, "first", func(ctx context.Context, tx pgx.Tx) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		return steps.Call(ctx, "second", func(ctx context.Context, key string) (int, error) {
			return 0, steps.Permanent(errors.New(msg))
		}, &steps.Opts{MaxAttempts: 1})
	})
	parentWF = workflow.Define("parent", func(ctx context.Context, amount int) (map[string]any, error) {
		return steps.Child(ctx, "pay", payWF, amount, nil)
	})
	parentWaitWF = workflow.Define("parent-wait", func(ctx context.Context, n int) (string, error) {
		return steps.Child(ctx, "wait", waitWF, n, nil)
	})
	waitWF = workflow.Define("wait", func(ctx context.Context, _ int) (string, error) {
		if err := steps.SetEvent(ctx, "status", "waiting for go"); err != nil {
			return "", err
		}
		return steps.Await[string](ctx, "go", "go", 0)
	})
)

// setup gives each test a database with idem and River migrated, an engine with the test
// workflows and a River client working its jobs, as an application has.
func setup(t testing.TB) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	require.NoError(t, idem.Migrate(ctx, pool))
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: quiet()})
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)
	e, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{payWF, failWF, waitWF, parentWF, parentWaitWF}, Lease: time.Second,
		ScanInterval: time.Second, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	workers := river.NewWorkers()
	require.NoError(t, e.AddWorkers(workers))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:           workers,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quiet(),
		TestOnly:          true,
	})
	require.NoError(t, err)
	e.SetClient(client)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.StopAndCancel(ctx)
	})
	return &testBundle{ctx: ctx, pool: pool, engine: e, log: &syncBuffer{}}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// handler makes a Handler of the bundle's engine that logs to b.log.
func (b *testBundle) handler(t testing.TB, opts *idemui.Options) *idemui.Handler {
	t.Helper()
	if opts == nil {
		opts = &idemui.Options{}
	}
	opts.Logger = slog.New(slog.NewTextHandler(b.log, nil))
	h, err := idemui.NewHandler(b.engine, opts)
	require.NoError(t, err)
	return h
}

// fixture runs the test workflows: two payments done, one failed, one awaiting.
func (b *testBundle) fixture(t testing.TB) {
	t.Helper()
	for _, id := range []string{"p-1", "p-2"} {
		_, err := payWF.Run(b.ctx, b.engine, idem.Key{Scope: "customer:bob", ID: id}, 70, nil)
		require.NoError(t, err)
	}
	_, err := failWF.Run(b.ctx, b.engine, idem.Key{Scope: "customer:eve", ID: "f-1"}, "card declined", nil)
	require.ErrorIs(t, err, workflow.ErrFailed)
	b.startWaiting(t, idem.Key{Scope: "customer:bob", ID: "w-1"})
}

// startWaiting starts a run of waitWF under key and waits until it awaits its signal.
func (b *testBundle) startWaiting(t testing.TB, key idem.Key) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return waitWF.StartTx(b.ctx, b.engine, tx, key, 1, nil) }))
	b.eventually(t, "the run awaits its signal", func() bool { return b.state(t, key) == "awaiting" })
}

func (b *testBundle) state(t testing.TB, key idem.Key) string {
	t.Helper()
	var s string
	err := b.pool.QueryRow(b.ctx, `SELECT state FROM idem_runs WHERE scope = $1 AND id = $2`, key.Scope, key.ID).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return s
}

func (b *testBundle) eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// response is what a request to the handler answered.
type response struct {
	status int
	header http.Header
	body   string
}

// get sends GET path to h.
func get(t testing.TB, h http.Handler, path string) response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return response{rec.Code, rec.Header(), rec.Body.String()}
}

// post sends a form to h with the given headers (a Cookie among them, where the test has one).
func post(t testing.TB, h http.Handler, path string, form url.Values, header map[string]string) response {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return response{rec.Code, rec.Header(), rec.Body.String()}
}

var tokenRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// confirm opens an action's confirmation page and returns its CSRF token and cookie.
func confirm(t testing.TB, h http.Handler, query string) (token, cookie string) {
	t.Helper()
	res := get(t, h, "/confirm?"+query)
	require.Equal(t, http.StatusOK, res.status, res.body)
	m := tokenRE.FindStringSubmatch(res.body)
	require.NotNil(t, m, "the confirmation page holds a token")
	c := (&http.Response{Header: res.header}).Cookies()
	require.Len(t, c, 1, "the confirmation page sets the CSRF cookie")
	return m[1], c[0].Name + "=" + c[0].Value
}
