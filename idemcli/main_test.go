package idemcli_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

// result is one run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

type testBundle struct {
	ctx  context.Context
	bin  string
	url  string
	pool *pgxpool.Pool
}

// setup gives each test its own empty database, and the binary built once for the whole test.
func setup(t *testing.T, bin string) *testBundle {
	t.Helper()
	return bundle(t, bin, pgtemp.NewDB(t))
}

func bundle(t *testing.T, bin, url string) *testBundle {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testBundle{ctx: context.Background(), bin: bin, url: url, pool: pool}
}

// build compiles cmd/idem into dir, as an operator would install it.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "idem")
	out, err := exec.Command("go", "build", "-o", bin, "../cmd/idem").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// idem runs the binary against the test's database, through DATABASE_URL as an operator would.
func (b *testBundle) idem(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(b.bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+b.url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("running idem: %v", err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

func (b *testBundle) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := b.idem(t, args...)
	require.Equal(t, 0, r.code, "idem %s: stderr: %s", strings.Join(args, " "), r.stderr)
	return r.stdout
}

func (b *testBundle) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, sql).Scan(&n))
	return n
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestCLI(t *testing.T) {
	t.Parallel()
	bin := build(t)

	t.Run("Usage", func(t *testing.T) {
		t.Parallel()
		b := &testBundle{bin: bin}
		r := b.idem(t)
		require.Equal(t, 2, r.code)
		require.Contains(t, r.stderr, "runs list")
		for _, args := range [][]string{{"--help"}, {"help"}, {"runs", "list", "--help"}, {"keys", "delete", "-h"}, {"migrate", "--help"}, {"runs", "fork", "--help"},
			{"runs", "--help"}, {"keys", "-h"}, {"help", "runs"}, {"help", "runs", "show"}} {
			r = b.idem(t, args...)
			require.Equal(t, 0, r.code, args)
			require.Contains(t, r.stdout, "Usage: idem", args)
			require.Empty(t, r.stderr)
		}
		for _, args := range [][]string{{"nope"}, {"runs"}, {"runs", "show", "only-scope"}, {"runs", "list", "--bogus"}, {"runs", "list", "--limit", "1001"},
			{"runs", "list", "--since", "yesterday"}, {"runs", "fork", "s", "a", "b"}, {"keys", "get", "s", "has space"},
			{"runs", "bogus"}, {"runs", "list", "--state", "bogus"}} {
			r = b.idem(t, args...)
			require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
			require.NotEmpty(t, r.stderr)
		}
		// A negative step is named as such, not taken for a missing flag.
		r = b.idem(t, "runs", "fork", "s", "a", "b", "--from", "-3")
		require.Equal(t, 2, r.code, r.stderr)
		require.Contains(t, r.stderr, "--from is -3")
		// No database at all.
		cmd := exec.Command(bin, "keys", "get", "s", "k")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		require.Equal(t, 2, exit.ExitCode())
		require.Contains(t, string(out), "DATABASE_URL")
	})

	t.Run("MigrateAndSchema", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bin)
		latest := len(idem.Migrations())
		require.Contains(t, b.ok(t, "migrate"), fmt.Sprintf("schema at version %d (was 0)", latest))
		require.Contains(t, b.ok(t, "migrate"), "nothing to do")
		var v map[string]int
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "migrate", "--json")), &v))
		require.Equal(t, latest, v["version"])
		require.Contains(t, b.ok(t, "migrate", "--to", "0"), fmt.Sprintf("schema at version 0 (was %d)", latest))
		require.Zero(t, b.count(t, `SELECT count(*) FROM pg_tables WHERE tablename = 'idem_keys'`))

		b.ok(t, "migrate", "--schema", "ops")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM pg_tables WHERE schemaname = 'ops' AND tablename = 'idem_keys'`))
		_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: "s", ID: "k"}, func(context.Context, pgx.Tx) (int, error) { return 1, nil }, idem.Schema("ops"))
		require.NoError(t, err)
		require.Contains(t, b.ok(t, "keys", "get", "--schema", "ops", "s", "k"), "1 bytes")
		r := b.idem(t, "keys", "get", "s", "k")
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "tables are missing")
		r = b.idem(t, "runs", "list")
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, `run "idem migrate"`, "the runs commands say what to do about missing tables too")
		r = b.idem(t, "migrate", "--to", strconv.Itoa(latest+1))
		require.Equal(t, 2, r.code, r.stderr)
		require.Contains(t, r.stderr, "--to must be a version from 0 to")
		b.ok(t, "migrate")
		r = b.idem(t, "runs", "list", "--after", "garbage")
		require.Equal(t, 2, r.code, r.stderr)
		require.Contains(t, r.stderr, "--after")
	})

	t.Run("Keys", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bin)
		b.ok(t, "migrate")
		key := idem.Key{Scope: "customer:42", ID: "order-1", Fingerprint: idem.Fingerprint("book")}
		_, err := idem.Run(b.ctx, b.pool, key, func(context.Context, pgx.Tx) (string, error) { return "receipt", nil })
		require.NoError(t, err)

		out := b.ok(t, "keys", "get", "customer:42", "order-1")
		require.Regexp(t, `(?m)^id\s+order-1$`, out)
		require.Regexp(t, `(?m)^result\s+9 bytes$`, out)
		require.Contains(t, out, "fingerprint")
		var info struct {
			Fingerprint string `json:"fingerprint"`
			ResultSize  int    `json:"result_size"`
		}
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "keys", "get", "--json", "customer:42", "order-1")), &info))
		require.Equal(t, hex.EncodeToString(key.Fingerprint), info.Fingerprint, "hex, as in the table")
		require.Equal(t, 9, info.ResultSize)

		require.Contains(t, b.ok(t, "keys", "delete", "customer:42", "order-1"), "deleted")
		r := b.idem(t, "keys", "get", "customer:42", "order-1")
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "not found")
		r = b.idem(t, "keys", "delete", "customer:42", "order-1")
		require.Equal(t, 1, r.code)

		// Reap: one expired key goes.
		_, err = idem.Run(b.ctx, b.pool, idem.Key{Scope: "s", ID: "old"}, func(context.Context, pgx.Tx) (int, error) { return 1, nil })
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 second'`)
		require.NoError(t, err)
		out = b.ok(t, "reap")
		require.Contains(t, out, "reaped 1 expired keys (1 of Do's, 0 runs, 0 outbox messages)")
		require.NotContains(t, out, "payload partitions", "Migrate made them all, and none is old enough to drop")
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys`))

		// Reap says which payload partitions it made and dropped: one of ten days ago goes, and
		// the last day ahead, removed here, comes back.
		now := time.Now().UTC()
		old := now.AddDate(0, 0, -10)
		require.NoError(t, store.For("").MakePartitions(b.ctx, b.pool, "idem_results", old, old))
		oldName := "idem_results_p" + old.Format("20060102")
		ahead := "idem_results_p" + now.AddDate(0, 0, 14).Format("20060102")
		_, err = b.pool.Exec(b.ctx, `DROP TABLE `+ahead)
		require.NoError(t, err)
		out = b.ok(t, "reap")
		require.Contains(t, out, `payload partitions made: "`+ahead+`"`, "named as in SQL")
		require.Contains(t, out, `payload partitions dropped: "`+oldName+`"`)
		require.Zero(t, b.count(t, `SELECT count(*) FROM pg_class WHERE relname = '`+oldName+`'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM pg_class WHERE relname = '`+ahead+`'`))

		// And the same in JSON, with empty lists as [] when there is nothing to say.
		var rep struct {
			Reaped, Keys, Runs, Outbox int64
			Created                    []string `json:"partitions_created"`
			Dropped                    []string `json:"partitions_dropped"`
			Skipped                    []string `json:"partitions_skipped"`
		}
		require.NoError(t, store.For("").MakePartitions(b.ctx, b.pool, "idem_outbox_payloads", old, old))
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "reap", "--json")), &rep))
		require.Equal(t, []string{`"idem_outbox_payloads_p` + old.Format("20060102") + `"`}, rep.Dropped)
		require.Equal(t, []string{}, rep.Created)
		require.Equal(t, []string{}, rep.Skipped)
		require.Zero(t, rep.Reaped)
	})

	// A parent run and its child: runs show lists the children and names the parent, and runs
	// list filters by parent.
	t.Run("Children", func(t *testing.T) {
		t.Parallel()
		b := bundle(t, bin, idemtest.NewDB(t, &idemtest.Opts{River: true}))
		child := workflow.Define("label", func(ctx context.Context, order string) (string, error) {
			return steps.Call(ctx, "print", func(context.Context, string) (string, error) { return "label for " + order, nil }, nil)
		})
		parent := workflow.Define("ship", func(ctx context.Context, order string) (string, error) {
			return steps.Child(ctx, "label", child, order, nil)
		})
		e, err := workflow.NewEngine(b.pool, &workflow.Config{Workflows: []workflow.Definition{parent, child}, Lease: time.Second, ScanInterval: time.Second, Logger: quiet()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() })
		workers := river.NewWorkers()
		require.NoError(t, e.AddWorkers(workers))
		client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{
			Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 5}}, Workers: workers,
			FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond, Logger: quiet(), TestOnly: true,
		})
		require.NoError(t, err)
		e.SetClient(client)
		require.NoError(t, client.Start(b.ctx))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = client.StopAndCancel(ctx)
		})
		key := idem.Key{Scope: "shop", ID: "order-9"}
		out, err := parent.Run(b.ctx, e, key, "order-9", &workflow.RunOpts{Wait: 20 * time.Second})
		require.NoError(t, err)
		require.Equal(t, "label for order-9", out)

		shown := b.ok(t, "runs", "show", "shop", "order-9")
		require.Regexp(t, `(?m)^STEP\s+CHILD\s+WORKFLOW\s+STATE\s+CREATED$`, shown)
		require.Regexp(t, `(?m)^1\s+\S+\s+label\s+done\s+`, shown)
		var page workflow.RunListResult
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "list", "--scope", "shop", "--parent", "order-9", "--json")), &page))
		require.Len(t, page.Runs, 1)
		require.Equal(t, "label", page.Runs[0].Workflow)
		childShown := b.ok(t, "runs", "show", "shop", page.Runs[0].ID)
		require.Regexp(t, `(?m)^parent\s+shop order-9 \(step #1\)$`, childShown)
		r := b.idem(t, "runs", "list", "--parent", "order-9")
		require.Equal(t, 2, r.code)
		require.Contains(t, r.stderr, "--parent needs --scope")
	})

	// The application (this test) runs a workflow engine and River; the CLI, with no workflow
	// registered, reads the runs and steers them, and the application's workers do the work.
	t.Run("Runs", func(t *testing.T) {
		t.Parallel()
		b := bundle(t, bin, idemtest.NewDB(t, &idemtest.Opts{River: true}))
		require.Contains(t, b.ok(t, "migrate"), "nothing to do")

		var broken atomic.Bool
		broken.Store(true)
		var runsOfB atomic.Int32
		wf := workflow.Define("payout", func(ctx context.Context, amount int) (string, error) {
			for _, name := range []string{"reserve", "charge", "settle"} {
				_, err := steps.Call(ctx, name, func(ctx context.Context, key string) (string, error) {
					if name == "charge" {
						runsOfB.Add(1)
						if broken.Load() {
							return "", steps.Permanent(errors.New("card processor down"))
						}
					}
					return name + " ok", nil
				}, nil)
				if err != nil {
					return "", err
				}
			}
			return "paid", nil
		})
		e, err := workflow.NewEngine(b.pool, &workflow.Config{Workflows: []workflow.Definition{wf}, Lease: time.Second, ScanInterval: time.Second, Logger: quiet(),
			Version: "v1"})
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() })
		workers := river.NewWorkers()
		require.NoError(t, e.AddWorkers(workers))
		client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{
			Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 5}}, Workers: workers,
			FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond, Logger: quiet(), TestOnly: true,
		})
		require.NoError(t, err)
		e.SetClient(client)
		require.NoError(t, client.Start(b.ctx))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = client.StopAndCancel(ctx)
		})

		key := idem.Key{Scope: "merchant:7", ID: "payout-1"}
		_, err = wf.Run(b.ctx, e, key, 30, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)

		out := b.ok(t, "runs", "list")
		require.Regexp(t, `(?m)^CREATED\s+SCOPE\s+ID\s+WORKFLOW\s+VERSION\s+STATE\s+ATTEMPTS\s+ERROR$`, out)
		require.Regexp(t, `(?m)merchant:7\s+payout-1\s+payout\s+v1\s+failed\s+1\s+.*card processor down`, out)
		var page workflow.RunListResult
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "list", "--state", "failed,cancelled", "--workflow", "payout", "--since", "1h", "--json")), &page))
		require.Len(t, page.Runs, 1)
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "list", "--state", "done", "--json")), &page))
		require.Empty(t, page.Runs)
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "list", "--version", "v0,v1", "--json")), &page))
		require.Len(t, page.Runs, 1)
		require.Equal(t, "v1", page.Runs[0].Version)
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "list", "--version", "v2", "--json")), &page))
		require.Empty(t, page.Runs)

		out = b.ok(t, "runs", "show", "merchant:7", "payout-1")
		require.Regexp(t, `(?m)^state\s+failed$`, out)
		require.Regexp(t, `(?m)^version\s+v1$`, out)
		require.Regexp(t, `(?m)^1\s+reserve\s+call\s+1\s+\S+\s+"reserve ok"$`, out)
		require.Regexp(t, `(?m)^2\s+charge\s+call\s+1\s+\S+\s+error: card processor down$`, out)
		require.Regexp(t, `(?m)^SEQ\s+STEP\s+ATTEMPT\s+AT\s+OUTCOME\s+ERROR$`, out, "every failed attempt is shown")
		require.Regexp(t, `(?m)^2\s+charge\s+1\s+\S+\s+permanent\s+card processor down$`, out)

		r := b.idem(t, "runs", "cancel", "merchant:7", "payout-1")
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "is failed and cannot be cancelled")

		broken.Store(false)
		require.Contains(t, b.ok(t, "runs", "resume", "merchant:7", "payout-1"), "resuming")
		waitState(t, b, key, "done")
		out2, err := wf.Get(b.ctx, e, key)
		require.NoError(t, err)
		require.Equal(t, "paid", out2)
		require.EqualValues(t, 2, runsOfB.Load(), "charge ran once more, reserve was replayed")
		var run workflow.RunRow
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "show", "--json", "merchant:7", "payout-1")), &run))
		require.Len(t, run.Steps, 3)
		require.Equal(t, workflow.RunStateDone, run.State)

		require.Contains(t, b.ok(t, "runs", "fork", "merchant:7", "payout-1", "payout-2", "--from", "3"), `into "payout-2"`)
		waitState(t, b, idem.Key{Scope: "merchant:7", ID: "payout-2"}, "done")
		require.EqualValues(t, 2, runsOfB.Load(), "the fork replayed charge")
		require.Regexp(t, `forked from +merchant:7 payout-1, its first 2 steps copied`, b.ok(t, "runs", "show", "merchant:7", "payout-2"))
		require.NotContains(t, b.ok(t, "runs", "show", "merchant:7", "payout-1"), "forked from")
		r = b.idem(t, "runs", "fork", "merchant:7", "payout-1", "payout-2", "--from", "3")
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "is taken")

		// A run nobody owns, cancelled twice.
		_, err = b.pool.Exec(b.ctx, `
INSERT INTO idem_keys (scope, id, workflow, expires_at) VALUES ('merchant:7', 'stuck', 'payout', 'infinity');
INSERT INTO idem_runs (scope, id, workflow, state, lease_expires_at) VALUES ('merchant:7', 'stuck', 'payout', 'running', now() + interval '1 hour')`)
		require.NoError(t, err)
		for range 2 {
			require.Contains(t, b.ok(t, "runs", "cancel", "--reason", "duplicate payout", "merchant:7", "stuck"), "cancelled")
		}
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "show", "merchant:7", "stuck", "--json")), &run))
		require.Equal(t, workflow.RunStateCancelled, run.State)
		require.Equal(t, "duplicate payout", run.Error)

		// A run whose code diverged from its history says where, and what to do.
		_, err = b.pool.Exec(b.ctx, `
INSERT INTO idem_keys (scope, id, workflow, expires_at) VALUES ('merchant:8', 'diverged', 'payout', 'infinity');
INSERT INTO idem_runs (scope, id, workflow, state, output, finished_at, expires_at) VALUES ('merchant:8', 'diverged', 'payout', 'failed',
	convert_to('{"error": "workflow payout diverged ...; put the change behind workflow.Patched", "reason": "nondeterministic",
	  "divergence": {"seq": 2, "stored_kind": "sleep", "stored_name": "cool-off", "called_kind": "call", "called_name": "fraud-check"}}', 'UTF8'),
	now(), now() + interval '1 hour')`)
		require.NoError(t, err)
		out = b.ok(t, "runs", "show", "merchant:8", "diverged")
		require.Regexp(t, `(?m)^reason\s+nondeterministic$`, out)
		require.Regexp(t, `(?m)^diverged\s+at step 2: the history has sleep "cool-off", the code called call "fraud-check"$`, out)
		require.Regexp(t, `(?m)^error\s+.*workflow.Patched$`, out)
		_, err = b.pool.Exec(b.ctx, `DELETE FROM idem_runs WHERE id = 'diverged'; DELETE FROM idem_keys WHERE id = 'diverged'`)
		require.NoError(t, err)

		// Paging: three runs, one to a page.
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "list", "--limit", "1", "--json")), &page))
		seen := []string{page.Runs[0].ID}
		for page.Next != "" {
			out := b.ok(t, "runs", "list", "--limit", "1", "--after", page.Next, "--json")
			page = workflow.RunListResult{}
			require.NoError(t, json.Unmarshal([]byte(out), &page))
			if len(page.Runs) > 0 {
				seen = append(seen, page.Runs[0].ID)
			}
		}
		require.Equal(t, []string{"stuck", "payout-2", "payout-1"}, seen)
		require.Contains(t, b.ok(t, "runs", "list", "--limit", "1"), "more: --after ")

		r = b.idem(t, "runs", "show", "merchant:7", "nope")
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "not found")
	})
}

// waitState polls the run's state until it is want: the application's River works the job in
// its own time.
func waitState(t *testing.T, b *testBundle, key idem.Key, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var state string
		err := b.pool.QueryRow(b.ctx, `SELECT state FROM idem_runs WHERE scope = $1 AND id = $2`, key.Scope, key.ID).Scan(&state)
		if err == nil && state == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %q (%v), not %q, after 30s", key.ID, state, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
