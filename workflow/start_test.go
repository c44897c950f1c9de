package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/tx"
	"github.com/idemkit/idem/workflow"
)

// counted is a workflow that records, with a statement of its own before its first step, every
// time its function is called: the test counts executions in SQL, as a user's log line or metric
// before the first step would count them. Its input says how it behaves before that step.
type countedIn struct {
	N     int    `json:"n"`
	Block bool   `json:"block,omitempty"` // wait for the test's release before the first step
	Panic string `json:"panic,omitempty"` // panic with this before the first step
	Fail  bool   `json:"fail,omitempty"`  // the first step stops the run (its context ends)
}

type counter struct {
	b       *testBundle
	entered chan struct{}
	release chan struct{}
}

func newCounter(b *testBundle) *counter {
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE IF NOT EXISTS executions (id bigserial PRIMARY KEY, wf text NOT NULL, n int NOT NULL)`)
	if err != nil {
		panic(err)
	}
	return &counter{b: b, entered: make(chan struct{}, 64), release: make(chan struct{})}
}

func (c *counter) define(name string) *workflow.Workflow[countedIn, int] {
	return c.defineDying(name, nil)
}

// defineDying is define with a hook in the second step, once the first has committed: the
// process "dies" there (the hook cancels the run's context), and the run keeps its lease until
// it expires.
func (c *counter) defineDying(name string, afterFirst func()) *workflow.Workflow[countedIn, int] {
	return workflow.Define(name, func(ctx context.Context, in countedIn) (int, error) {
		if _, err := c.b.pool.Exec(context.WithoutCancel(ctx), `INSERT INTO executions (wf, n) VALUES ($1, $2)`, name, in.N); err != nil {
			return 0, err
		}
		if in.Block {
			c.entered <- struct{}{}
			<-c.release
		}
		if in.Panic != "" {
			panic(in.Panic)
		}
		out, err := steps.Tx(ctx, "first", func(ctx context.Context, t pgx.Tx) (int, error) {
			if in.Fail {
				return 0, errors.New("unreachable: the run stops instead")
			}
			return in.N * 2, effect(ctx, t, name, "first", "")
		}, &steps.Opts{MaxAttempts: 1})
		if err != nil {
			return 0, err
		}
		return steps.Call(ctx, "second", func(ctx context.Context, _ string) (int, error) {
			if afterFirst != nil {
				afterFirst()
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return out + 1, nil
		}, nil)
	})
}

func (c *counter) executions(t testing.TB, name string) int {
	return c.b.count(t, `SELECT count(*) FROM executions WHERE wf = $1`, name)
}

// engineKinds are the two kinds of DB an engine may have: a pool, whose runs hold connections
// of their own, and any other DB, whose runs begin transactions with DB.Begin. The start
// contract is the same for both, and every case below runs against both.
var engineKinds = []struct {
	name string
	db   func(b *testBundle) workflow.DB
}{
	{"Pool", func(b *testBundle) workflow.DB { return b.pool }},
	{"NotAPool", func(b *testBundle) workflow.DB { return plainDB{b.pool} }},
}

func (b *testBundle) engineOn(t testing.TB, db workflow.DB, cfg *workflow.Config) *workflow.Engine {
	t.Helper()
	e, err := workflow.NewEngine(db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

// TestStartContract checks that no workflow code runs for a key the call does not own: a
// finished run's key replays, a duplicate in flight is answered in flight (or waits), and a key
// of another workflow, of idem.Do, or of other input is a mismatch, all before the workflow
// function is called. Executions are counted in SQL.
func TestStartContract(t *testing.T) {
	t.Parallel()
	for _, kind := range engineKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()

			t.Run("AFinishedRunReplaysWithoutRunningCode", func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				c := newCounter(b)
				wf := c.define("replayed")
				e := b.engineOn(t, kind.db(b), fastConfig(wf))
				k := idem.Key{Scope: "s", ID: "k"}
				first, err := wf.Run(b.ctx, e, k, countedIn{N: 20}, nil)
				require.NoError(t, err)
				require.Equal(t, 41, first)
				for range 20 {
					var replayed bool
					out, err := wf.Run(b.ctx, e, k, countedIn{N: 20}, &workflow.RunOpts{Replayed: &replayed})
					require.NoError(t, err)
					require.Equal(t, first, out)
					require.True(t, replayed)
				}
				require.Equal(t, 1, c.executions(t, "replayed"), "20 replays executed no workflow code")
				require.Equal(t, 1, b.effects(t, "first"))
			})

			t.Run("ConcurrentDuplicatesRunNoCode", func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				c := newCounter(b)
				wf := c.define("dup")
				e := b.engineOn(t, kind.db(b), fastConfig(wf))
				k := idem.Key{Scope: "s", ID: "k"}
				in := countedIn{N: 5, Block: true}
				firstDone := make(chan error, 1)
				go func() {
					_, err := wf.Run(b.ctx, e, k, in, nil)
					firstDone <- err
				}()
				<-c.entered // the first call is in its code, before its first step

				var wg sync.WaitGroup
				errs := make(chan error, 16)
				for range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						_, err := wf.Run(b.ctx, e, k, in, nil)
						errs <- err
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					require.ErrorIs(t, err, idem.ErrInFlight)
				}
				require.Equal(t, 1, c.executions(t, "dup"), "the duplicates executed no code; the first call is the one running")

				// With Wait, duplicates wait for the first call's outcome, and still run nothing.
				outs := make(chan int, 16)
				waitErrs := make(chan error, 16)
				var wg2 sync.WaitGroup
				for range 16 {
					wg2.Add(1)
					go func() {
						defer wg2.Done()
						out, err := wf.Run(b.ctx, e, k, in, &workflow.RunOpts{Wait: 30 * time.Second})
						outs <- out
						waitErrs <- err
					}()
				}
				time.Sleep(100 * time.Millisecond) // let them find the run in flight
				close(c.release)
				require.NoError(t, <-firstDone)
				wg2.Wait()
				close(outs)
				close(waitErrs)
				for err := range waitErrs {
					require.NoError(t, err)
				}
				for out := range outs {
					require.Equal(t, 11, out)
				}
				require.Equal(t, 1, c.executions(t, "dup"))
				require.Equal(t, 1, b.effects(t, "first"))
			})

			t.Run("AnotherWorkflowsKey", func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				c := newCounter(b)
				a, other := c.define("a"), c.define("b")
				e := b.engineOn(t, kind.db(b), fastConfig(a, other))
				k := idem.Key{Scope: "s", ID: "k"}
				_, err := a.Run(b.ctx, e, k, countedIn{N: 1}, nil)
				require.NoError(t, err)
				_, err = other.Run(b.ctx, e, k, countedIn{N: 1}, nil)
				require.ErrorIs(t, err, idem.ErrMismatch)
				require.ErrorContains(t, err, `belongs to a run of workflow "a", not "b"`)
				require.Zero(t, c.executions(t, "b"), "no code of b ran")
			})

			t.Run("AKeyOfDo", func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				c := newCounter(b)
				wf := c.define("wf")
				e := b.engineOn(t, kind.db(b), fastConfig(wf))
				k := idem.Key{Scope: "s", ID: "k"}
				require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
					_, err := idem.Do(ctx, t, k, func(context.Context, pgx.Tx) (int, error) { return 1, nil })
					return err
				}))
				_, err := wf.Run(b.ctx, e, k, countedIn{N: 1}, nil)
				require.ErrorIs(t, err, idem.ErrMismatch)
				require.ErrorContains(t, err, "belongs to idem.Do")
				require.Zero(t, c.executions(t, "wf"))
			})

			t.Run("OtherInput", func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				c := newCounter(b)
				wf := c.define("wf")
				e := b.engineOn(t, kind.db(b), fastConfig(wf))
				k := idem.Key{Scope: "s", ID: "k"}
				_, err := wf.Run(b.ctx, e, k, countedIn{N: 1}, nil)
				require.NoError(t, err)
				_, err = wf.Run(b.ctx, e, k, countedIn{N: 2}, nil)
				require.ErrorIs(t, err, idem.ErrMismatch)
				require.ErrorContains(t, err, "another input")
				require.Equal(t, 1, c.executions(t, "wf"))
			})

			t.Run("ATakeoverRunsTheCodeOnce", func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				c := newCounter(b)
				wf := c.define("taken")
				k := idem.Key{Scope: "s", ID: "k"}
				// A process whose run stops after its first step, leaving its lease to expire.
				ctx, cancel := context.WithCancel(b.ctx)
				dies := c.defineDying("taken", cancel)
				dying := b.engineOn(t, kind.db(b), fastConfig(dies))
				_, err := dies.Run(ctx, dying, k, countedIn{N: 3}, nil)
				require.Error(t, err)
				require.Equal(t, 1, c.executions(t, "taken"))
				b.waitLeaseExpired(t, k)

				e := b.engineOn(t, kind.db(b), fastConfig(wf))
				out, err := wf.Run(b.ctx, e, k, countedIn{N: 3}, nil)
				require.NoError(t, err)
				require.Equal(t, 7, out)
				require.Equal(t, 2, c.executions(t, "taken"), "the taking call ran the code once, from the history")
				require.Equal(t, 1, b.effects(t, "first"), "the first step was replayed, not run")
				_, attempts := b.state(t, k)
				require.Equal(t, 2, attempts)
			})

			t.Run("APanicBeforeTheFirstStepLeavesNothing", func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				c := newCounter(b)
				wf := c.define("panics")
				e := b.engineOn(t, kind.db(b), fastConfig(wf))
				k := idem.Key{Scope: "s", ID: "k"}
				require.PanicsWithValue(t, "boom", func() { _, _ = wf.Run(b.ctx, e, k, countedIn{N: 1, Panic: "boom"}, nil) })
				b.requireNoRun(t, k)
				out, err := wf.Run(b.ctx, e, k, countedIn{N: 1}, nil)
				require.NoError(t, err, "the key is free again")
				require.Equal(t, 3, out)
			})

			t.Run("ACancelInTheFirstStepLeavesNothing", func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				c := newCounter(b)
				k := idem.Key{Scope: "s", ID: "k"}
				ctx, cancel := context.WithCancel(b.ctx)
				wf := workflow.Define("cancelled", func(ctx context.Context, in countedIn) (int, error) {
					if _, err := c.b.pool.Exec(context.WithoutCancel(ctx), `INSERT INTO executions (wf, n) VALUES ('cancelled', $1)`, in.N); err != nil {
						return 0, err
					}
					return steps.Tx(ctx, "first", func(ctx context.Context, t pgx.Tx) (int, error) {
						if err := effect(ctx, t, "cancelled", "first", ""); err != nil {
							return 0, err
						}
						cancel() // the caller goes away while the first step works
						return 0, ctx.Err()
					}, nil)
				})
				e := b.engineOn(t, kind.db(b), fastConfig(wf))
				_, err := wf.Run(ctx, e, k, countedIn{N: 1}, nil)
				require.ErrorIs(t, err, context.Canceled)
				b.requireNoRun(t, k)

				cancel = func() {} // the retry's caller stays
				_, err = wf.Run(b.ctx, e, k, countedIn{N: 1}, nil)
				require.NoError(t, err, "the key is free again")
				require.Equal(t, 2, c.executions(t, "cancelled"), "the retry started over")
				require.Equal(t, 1, b.effects(t, "first"))
			})

			t.Run("AStopInTheFirstStepLeavesNothing", func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				name := "stops"
				k := idem.Key{Scope: "s", ID: "k"}
				stops := workflow.Define(name, func(ctx context.Context, in countedIn) (int, error) {
					return steps.Tx(ctx, "first", func(ctx context.Context, t pgx.Tx) (int, error) {
						if err := effect(ctx, t, name, "first", ""); err != nil {
							return 0, err
						}
						if in.Fail {
							ctx, cancel := context.WithCancel(ctx)
							cancel()
							<-ctx.Done()
							return 0, workflow.StopRun(ctx, fmt.Errorf("the process stops: %w", ctx.Err()))
						}
						return in.N, nil
					}, nil)
				})
				e := b.engineOn(t, kind.db(b), fastConfig(stops))
				_, err := stops.Run(b.ctx, e, k, countedIn{N: 1, Fail: true}, nil)
				require.ErrorContains(t, err, "its key is free")
				b.requireNoRun(t, k)
				out, err := stops.Run(b.ctx, e, k, countedIn{N: 2}, nil)
				require.NoError(t, err)
				require.Equal(t, 2, out)
				require.Equal(t, 1, b.effects(t, "first"))
			})
		})
	}
}

// TestStartTxLogsAStart checks that a run started with StartTx, which its resume job begins, is
// logged as a start, not as a resumed run on its first attempt (which reads as crash recovery).
func TestStartTxLogsAStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newCounter(b)
	wf := c.define("background")
	var logs syncBuffer
	cfg := fastConfig(wf)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	e := b.engine(t, cfg)
	b.startRiver(t, e)
	k := idem.Key{Scope: "s", ID: "k"}
	require.NoError(t, b.inTx(func(ctx context.Context, t pgx.Tx) error { return wf.StartTx(ctx, e, t, k, countedIn{N: 1}) }))
	require.Equal(t, "done", b.waitFinished(t, k))
	require.Contains(t, logs.String(), `msg="workflow: starting run" workflow=background`)
	require.NotContains(t, logs.String(), "resuming run")
}
