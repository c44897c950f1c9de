package workflow_test

import (
	"context"
	"errors"
	"fmt"
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

type awaitReq struct {
	Count   int   `json:"count"`   // how many signals to await
	Timeout int64 `json:"timeout"` // per await, in ms; 0 for none
}

// newAwaiter is a workflow that awaits req.Count signals named "tick" and returns their
// payloads, "timeout" for an await that timed out. gate, when set, holds the run before its
// first await until it is closed.
func newAwaiter(gate <-chan struct{}) *workflow.Workflow[awaitReq, []string] {
	return workflow.Define("awaiter", func(ctx context.Context, req awaitReq) ([]string, error) {
		if _, err := steps.Tx(ctx, "open", func(ctx context.Context, tx pgx.Tx) (int, error) {
			return 0, effect(ctx, tx, "awaiter", "open", "")
		}, nil); err != nil {
			return nil, err
		}
		if gate != nil {
			if _, err := steps.Call(ctx, "gate", func(ctx context.Context, _ string) (int, error) {
				<-gate
				return 0, nil
			}, nil); err != nil {
				return nil, err
			}
		}
		var got []string
		for i := range req.Count {
			v, err := steps.Await[string](ctx, fmt.Sprintf("tick-%d", i), "tick", time.Duration(req.Timeout)*time.Millisecond)
			switch {
			case errors.Is(err, workflow.ErrAwaitTimeout):
				v = "timeout"
			case err != nil:
				return nil, err
			}
			got = append(got, v)
		}
		return got, nil
	})
}

// signal sends "tick" to the run under key in a transaction of its own.
func (b *testBundle) signal(t *testing.T, e *workflow.Engine, key idem.Key, payload string, opts *workflow.SignalOpts) *workflow.SignalResult {
	t.Helper()
	var res *workflow.SignalResult
	require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
		var err error
		res, err = e.SignalTx(ctx, t, key, "tick", payload, opts)
		return err
	}))
	return res
}

func TestSignal(t *testing.T) {
	t.Parallel()

	t.Run("BeforeTheAwaitIsKept", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		gate := make(chan struct{})
		wf := newAwaiter(gate)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		type result struct {
			out []string
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, err := wf.Run(b.ctx, e, waitKey("g1"), awaitReq{Count: 1}, nil)
			done <- result{out, err}
		}()
		// The run exists once its first step committed, before the gate.
		eventually(t, 20*time.Second, "the run to exist", func() bool {
			return b.count(t, `SELECT count(*) FROM idem_runs`) == 1
		})
		res := b.signal(t, e, waitKey("g1"), "early", nil)
		require.False(t, res.Duplicate)
		require.Positive(t, res.Seq)
		close(gate)
		r := <-done
		require.NoError(t, r.err, "the signal was in the mailbox: no suspension")
		require.Equal(t, []string{"early"}, r.out)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_signals WHERE consumed_at IS NOT NULL AND consumed_step = 3`))
	})

	t.Run("AfterTheAwaitWakesTheRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newAwaiter(nil)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		_, err := wf.Run(b.ctx, e, waitKey("a1"), awaitReq{Count: 1}, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		var leased bool
		var waitName string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT lease_token IS NOT NULL, wait_name FROM idem_runs WHERE state = 'awaiting'`).Scan(&leased, &waitName))
		require.False(t, leased)
		require.Equal(t, "tick", waitName)
		require.Zero(t, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake'`), "no timeout: nothing scheduled")

		b.signal(t, e, waitKey("a1"), "late", nil)
		out, err := runUntilDone(t, b, wf, e, waitKey("a1"), awaitReq{Count: 1})
		require.NoError(t, err)
		require.Equal(t, []string{"late"}, out)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'open'`))
	})

	t.Run("RolledBackIsNeverDelivered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newAwaiter(nil)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		_, err := wf.Run(b.ctx, e, waitKey("r1"), awaitReq{Count: 1}, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)

		errRollback := errors.New("the order was refused")
		err = tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			if _, err := e.SignalTx(ctx, t, waitKey("r1"), "tick", "rolled-back", nil); err != nil {
				return err
			}
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_signals`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake'`))
		state, _ := b.state(t, waitKey("r1"))
		require.Equal(t, "awaiting", state)

		b.signal(t, e, waitKey("r1"), "committed", nil)
		out, err := runUntilDone(t, b, wf, e, waitKey("r1"), awaitReq{Count: 1})
		require.NoError(t, err)
		require.Equal(t, []string{"committed"}, out)
	})

	t.Run("InSendOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newAwaiter(nil)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		_, err := wf.Run(b.ctx, e, waitKey("o1"), awaitReq{Count: 5}, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		// Some sent in one transaction, some in others; other names do not count.
		require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			for _, p := range []string{"1", "2"} {
				if _, err := e.SignalTx(ctx, t, waitKey("o1"), "tick", p, nil); err != nil {
					return err
				}
				if _, err := e.SignalTx(ctx, t, waitKey("o1"), "tock", "x"+p, nil); err != nil {
					return err
				}
			}
			return nil
		}))
		for _, p := range []string{"3", "4", "5"} {
			b.signal(t, e, waitKey("o1"), p, nil)
		}
		out, err := runUntilDone(t, b, wf, e, waitKey("o1"), awaitReq{Count: 5})
		require.NoError(t, err)
		require.Equal(t, []string{"1", "2", "3", "4", "5"}, out)
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_signals WHERE name = 'tock' AND consumed_at IS NULL`))
	})

	t.Run("DedupeID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newAwaiter(nil)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		req := awaitReq{Count: 2, Timeout: 1000}
		_, err := wf.Run(b.ctx, e, waitKey("u1"), req, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		first := b.signal(t, e, waitKey("u1"), "evt_1", &workflow.SignalOpts{DedupeID: "evt_1"})
		require.False(t, first.Duplicate)
		again := b.signal(t, e, waitKey("u1"), "evt_1", &workflow.SignalOpts{DedupeID: "evt_1"})
		require.True(t, again.Duplicate, "a webhook delivered twice is one signal")
		require.Zero(t, again.Seq)
		out, err := runUntilDone(t, b, wf, e, waitKey("u1"), req)
		require.NoError(t, err)
		require.Equal(t, []string{"evt_1", "timeout"}, out)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_signals`))
		// Even once consumed.
		require.ErrorIs(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			_, err := e.SignalTx(ctx, t, waitKey("u1"), "tick", "evt_1", &workflow.SignalOpts{DedupeID: "evt_1"})
			return err
		}), workflow.ErrRunFinished)
	})

	t.Run("AwaitTimeoutIsABranch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newAwaiter(nil)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		req := awaitReq{Count: 1, Timeout: 500}
		out, err := runUntilDone(t, b, wf, e, waitKey("t1"), req)
		require.NoError(t, err)
		require.Equal(t, []string{"timeout"}, out)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps WHERE kind = 'await' AND convert_from(output, 'UTF8') LIKE '%timed_out%'`))
		// A signal sent now is refused: the run is done.
		require.ErrorIs(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			_, err := e.SignalTx(ctx, t, waitKey("t1"), "tick", "too late", nil)
			return err
		}), workflow.ErrRunFinished)
	})

	t.Run("UnknownKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newAwaiter(nil)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		err := tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			_, err := e.SignalTx(ctx, t, waitKey("nobody"), "tick", 1, nil)
			return err
		})
		require.ErrorIs(t, err, workflow.ErrRunNotFound)
		require.ErrorContains(t, err, `"nobody"`)
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_signals`))
	})
}

// TestSignalExactlyOnce sends many signals from many goroutines while two engines, each with
// its own River client, race to wake the run, helped by extra wake jobs: every signal must be
// consumed once, by one await, and the run must see each once.
func TestSignalExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 40
	wf := newAwaiter(nil)
	e1 := b.engine(t, fastConfig(wf))
	e2 := b.engine(t, fastConfig(wf))
	c1 := b.startRiver(t, e1)
	b.startRiver(t, e2)
	req := awaitReq{Count: n}
	_, err := wf.Run(b.ctx, e1, waitKey("x1"), req, nil)
	require.ErrorIs(t, err, idem.ErrInFlight)

	var created int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (extract(epoch FROM created_at) * 1000000)::int8 FROM idem_runs`).Scan(&created))
	var wg sync.WaitGroup
	errs := make(chan error, n*2)
	for g := range 8 {
		wg.Add(1)
		go func() {
			// No require off the test goroutine: errors go to errs, checked below.
			defer wg.Done()
			e := []*workflow.Engine{e1, e2}[g%2]
			for i := g; i < n; i += 8 {
				errs <- tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
					_, err := e.SignalTx(ctx, t, waitKey("x1"), "tick", fmt.Sprint(i), nil)
					return err
				})
				// A wake job for whatever step the run waits at, unique to nobody.
				_, err := c1.Insert(b.ctx, workflow.WakeArgs{Scope: "merchant:7", ID: "x1", Generation: created, Reason: "test"}, nil)
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	out, err := runUntilDone(t, b, wf, e1, waitKey("x1"), req)
	require.NoError(t, err)
	require.Len(t, out, n)
	seen := map[string]bool{}
	for _, v := range out {
		require.False(t, seen[v], "signal %s returned twice", v)
		seen[v] = true
	}
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM idem_signals WHERE consumed_at IS NOT NULL`))
	require.Equal(t, n, b.count(t, `SELECT count(DISTINCT consumed_step) FROM idem_signals`))
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM idem_steps WHERE kind = 'await'`))
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM idem_signals s JOIN idem_steps p ON p.scope = s.scope AND p.id = s.id AND p.seq = s.consumed_step
WHERE convert_from(p.output, 'UTF8')::jsonb -> 'signal' = to_jsonb(s.seq)`), "each await's checkpoint names the signal it consumed")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'open'`))
}

// inTx runs fn in a transaction of the bundle's pool.
func (b *testBundle) inTx(fn func(ctx context.Context, t pgx.Tx) error) error {
	return pgx.BeginFunc(b.ctx, b.pool, func(t pgx.Tx) error { return fn(b.ctx, t) })
}
