package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/recordtest"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// TestKeysNotRecorded holds idem to its promise about keys in telemetry: every span, span
// event, metric point and log record (at debug level) that Do, Run, Reap, idemhttp and a
// workflow engine make, through every outcome, carries no key ID, not even in the error texts
// it records: the errors of idem (which name the key for the caller), of Postgres (which quotes a
// value it cannot read) and of the application (which may quote the key). The workflow's runs
// go through a retried step, a takeover after a lost owner, a failure and a fork; River's own
// log records of the engine's jobs are captured too. With the RecordKeys settings the same
// records carry the IDs, which shows that the test sees them.
func TestKeysNotRecorded(t *testing.T) {
	t.Parallel()
	for _, full := range []bool{false, true} {
		t.Run(map[bool]string{false: "Hashed", true: "RecordKeys"}[full], func(t *testing.T) {
			t.Parallel()
			b := &recordsBundle{c: recordtest.New(t), full: full}
			url := idemtest.NewDB(t, &idemtest.Opts{River: true})
			pool, err := pgxpool.New(context.Background(), url)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			_, err = pool.Exec(context.Background(), `CREATE TABLE orders (id bigserial PRIMARY KEY, key text NOT NULL)`)
			require.NoError(t, err)
			b.pool = pool

			b.doAndRun(t)
			b.http(t)
			b.workflow(t)

			joined := strings.Join(b.c.Records(t), "\n")
			for _, want := range []string{"idem.Do", "idem.Run", "idem.Reap", "idemhttp.request", "idem.workflow.run", "idem.workflow.step",
				"idem.do.outcomes", "idem.step.retries", "event retry", "taking over run", "run forked", "starting run",
				"invalid input syntax for type integer", "declined for"} {
				require.Contains(t, joined, want, "the capture has this record; without it the test would prove nothing")
			}
			if full {
				for _, id := range b.ids {
					require.Contains(t, joined, id.ID, "RecordKeys records the ID")
				}
				return
			}
			ids := make([]string, len(b.ids))
			for i, id := range b.ids {
				ids[i] = id.ID
			}
			b.c.RequireAbsent(t, ids...)
			for _, id := range b.ids {
				require.Contains(t, joined, redact.Hash(id.Scope, id.ID), "key %q is named by its hash", id.ID)
			}
		})
	}
}

type recordsBundle struct {
	c    *recordtest.Capture
	full bool
	pool *pgxpool.Pool
	ids  []redact.Key // every key the test used
}

// key makes a key that no record may carry, distinct enough that a match is a leak.
func (b *recordsBundle) key(scope, name string) idem.Key {
	k := idem.Key{Scope: scope, ID: "k-" + name + "-5e1d9a"}
	b.ids = append(b.ids, redact.Key{Scope: k.Scope, ID: k.ID})
	return k
}

func (b *recordsBundle) opts() []idem.Option {
	opts := []idem.Option{idem.TracerProvider(b.c.TP), idem.MeterProvider(b.c.MP), idem.Logger(b.c.Logger)}
	if b.full {
		opts = append(opts, idem.RecordKeys())
	}
	return opts
}

// doAndRun: a run, a replay, a reused key, a function's error quoting its key, Postgres's
// error quoting it, a key in flight, and a reap.
func (b *recordsBundle) doAndRun(t *testing.T) {
	ctx := context.Background()
	order := func(key idem.Key) func(context.Context, pgx.Tx) (int64, error) {
		return func(ctx context.Context, t pgx.Tx) (int64, error) {
			var id int64
			err := t.QueryRow(ctx, `INSERT INTO orders (key) VALUES ($1) RETURNING id`, key.ID).Scan(&id)
			return id, err
		}
	}
	k := b.key("tenant-a", "run")
	k.Fingerprint = idem.Fingerprint("first")
	_, err := idem.Run(ctx, b.pool, k, order(k), b.opts()...)
	require.NoError(t, err)
	_, err = idem.Run(ctx, b.pool, k, order(k), b.opts()...)
	require.NoError(t, err)
	k.Fingerprint = idem.Fingerprint("second")
	_, err = idem.Run(ctx, b.pool, k, order(k), b.opts()...)
	require.ErrorIs(t, err, idem.ErrMismatch)

	declined := b.key("tenant-a", "declined")
	_, err = idem.Run(ctx, b.pool, declined, func(context.Context, pgx.Tx) (int, error) {
		return 0, fmt.Errorf("card declined for order %s", declined.ID)
	}, b.opts()...)
	require.ErrorContains(t, err, declined.ID, "the caller's error names the key")

	quoted := b.key("tenant-a", "quoted")
	err = pgx.BeginFunc(ctx, b.pool, func(t pgx.Tx) error {
		_, err := idem.Do(ctx, t, quoted, func(ctx context.Context, t pgx.Tx) (int, error) {
			var n int
			err := t.QueryRow(ctx, `SELECT $1::int`, quoted.ID).Scan(&n)
			return n, err
		}, b.opts()...)
		return err
	})
	require.ErrorContains(t, err, "invalid input syntax")

	busy := b.key("tenant-a", "busy")
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(ctx, b.pool, func(t pgx.Tx) error {
			_, err := idem.Do(ctx, t, busy, func(context.Context, pgx.Tx) (int, error) {
				close(held)
				<-release
				return 1, nil
			}, b.opts()...)
			return err
		})
	}()
	<-held
	_, err = idem.Run(ctx, b.pool, busy, order(busy), b.opts()...)
	require.ErrorIs(t, err, idem.ErrInFlight)
	close(release)
	require.NoError(t, <-done)

	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE id = $1`, busy.ID)
	require.NoError(t, err)
	_, err = idem.Reap(ctx, b.pool, b.opts()...)
	require.NoError(t, err)
}

// http: a stored response, its replay, a reused key, and a handler whose statement failed (its
// error quoting the key) and which answered success anyway.
func (b *recordsBundle) http(t *testing.T) {
	mw, err := idemhttp.Middleware(b.pool, &idemhttp.Config{
		Scope:  func(*http.Request) string { return "tenant-h" },
		Logger: b.c.Logger, TracerProvider: b.c.TP, MeterProvider: b.c.MP, RecordKeys: b.full,
	})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, _ := idemhttp.Tx(r.Context())
		key := r.Header.Get("Idempotency-Key")
		if r.URL.Path == "/quote" {
			var n int
			_ = t.QueryRow(r.Context(), `SELECT $1::int`, key).Scan(&n)
		} else if _, err := t.Exec(r.Context(), `INSERT INTO orders (key) VALUES ($1)`, key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)
	post := func(path string, key idem.Key, body string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key.ID)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	k := b.key("tenant-h", "http")
	require.Equal(t, http.StatusCreated, post("/orders", k, "a"))
	require.Equal(t, http.StatusCreated, post("/orders", k, "a"))
	require.Equal(t, http.StatusUnprocessableEntity, post("/orders", k, "b"))
	require.Equal(t, http.StatusInternalServerError, post("/quote", b.key("tenant-h", "http-quote"), "a"))
}

// workflow: a step retried after an error that quotes the key, an owner that dies and a call
// that takes its run over, a run that fails with an error quoting the key, and a fork that
// River runs.
func (b *recordsBundle) workflow(t *testing.T) {
	ctx := context.Background()
	var crashed atomic.Bool
	type input struct {
		Key   string `json:"key"`
		Crash bool   `json:"crash"`
		Fail  bool   `json:"fail"`
	}
	var (
		mu       sync.Mutex
		attempts = map[string]int{}
		crash    context.CancelFunc
	)
	wf := workflow.Define("payout", func(ctx context.Context, in input) (string, error) {
		_, err := steps.Call(ctx, "charge", func(ctx context.Context, _ string) (string, error) {
			mu.Lock()
			attempts[in.Key]++
			first := attempts[in.Key] == 1
			mu.Unlock()
			if first {
				return "", fmt.Errorf("provider timed out on %s", in.Key) // retried
			}
			return "charged", nil
		}, &steps.Opts{MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
		if err != nil {
			return "", err
		}
		if in.Crash && crashed.CompareAndSwap(false, true) {
			crash() // the owner dies here
			<-ctx.Done()
			return "", ctx.Err()
		}
		return steps.Tx(ctx, "settle", func(ctx context.Context, tx pgx.Tx) (string, error) {
			if in.Fail {
				return "", steps.Permanent(fmt.Errorf("settlement declined for %s", in.Key))
			}
			_, err := tx.Exec(ctx, `INSERT INTO orders (key) VALUES ($1)`, in.Key)
			return "settled", err
		}, nil)
	})
	e, err := workflow.NewEngine(b.pool, &workflow.Config{Workflows: []workflow.Definition{wf}, Lease: time.Second, ScanInterval: time.Second,
		Logger: b.c.Logger, TracerProvider: b.c.TP, MeterProvider: b.c.MP, RecordKeys: b.full})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })

	// An owner that dies after its first step; the next call takes the run over once the lease
	// has run out (no River yet: nothing else resumes it).
	k := b.key("tenant-w", "takeover")
	runCtx, cancel := context.WithCancel(ctx)
	crash = cancel
	_, err = wf.Run(runCtx, e, k, input{Key: k.ID, Crash: true}, nil)
	require.Error(t, err)
	require.Eventually(t, func() bool {
		var expired bool
		_ = b.pool.QueryRow(ctx, `SELECT lease_expires_at <= now() FROM idem_runs WHERE id = $1`, k.ID).Scan(&expired)
		return expired
	}, 10*time.Second, 20*time.Millisecond)
	out, err := wf.Run(ctx, e, k, input{Key: k.ID, Crash: true}, nil)
	require.NoError(t, err)
	require.Equal(t, "settled", out)

	failing := b.key("tenant-w", "fails")
	_, err = wf.Run(ctx, e, failing, input{Key: failing.ID, Fail: true}, nil)
	require.ErrorIs(t, err, workflow.ErrFailed)
	_, err = wf.Run(ctx, e, failing, input{Key: failing.ID, Fail: true}, nil)
	require.ErrorIs(t, err, workflow.ErrFailed, "a replay of the failure")

	// River works a fork; its own logger is captured too.
	workers := river.NewWorkers()
	require.NoError(t, e.AddWorkers(workers))
	client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}, Workers: workers,
		FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond, Logger: b.c.Logger, TestOnly: true,
	})
	require.NoError(t, err)
	e.SetClient(client)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.StopAndCancel(sctx)
	})
	forked := b.key("tenant-w", "forked")
	require.NoError(t, e.RunFork(ctx, k, forked, 2))
	require.Eventually(t, func() bool {
		out, err := wf.Get(ctx, e, forked)
		return err == nil && out == "settled"
	}, 20*time.Second, 20*time.Millisecond, "the fork runs its last step again")
}
