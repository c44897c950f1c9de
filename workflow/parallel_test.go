package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/roundtrip"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// fanOut is a workflow that reserves n items in parallel Tx branches and then sums what they
// returned; in flight and peak count the branches that run at once, and failAt makes one branch
// fail for good.
type fanOut struct {
	inFlight, peak atomic.Int32
	calls          atomic.Int32  // branch bodies that ran
	hold           chan struct{} // when set, every branch waits on it before it returns
}

type fanIn struct {
	N      int `json:"n"`
	FailAt int `json:"fail_at,omitempty"` // 1-based; 0 for none
}

func (f *fanOut) define(name string) *workflow.Workflow[fanIn, int] {
	return workflow.Define(name, func(ctx context.Context, in fanIn) (int, error) {
		futures := make([]*steps.Future[int], in.N)
		for i := range in.N {
			futures[i] = steps.GoTx(ctx, fmt.Sprintf("item %d", i+1), func(ctx context.Context, tx pgx.Tx) (int, error) {
				f.calls.Add(1)
				now := f.inFlight.Add(1)
				defer f.inFlight.Add(-1)
				for p := f.peak.Load(); now > p && !f.peak.CompareAndSwap(p, now); p = f.peak.Load() {
				}
				if f.hold != nil {
					<-f.hold
				}
				if i+1 == in.FailAt {
					return 0, steps.Permanent(errors.New("out of stock"))
				}
				var xid int64
				if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
					return 0, err
				}
				return i + 1, effect(ctx, tx, name, fmt.Sprintf("item %d", i+1), fmt.Sprint(xid))
			}, &steps.Opts{MaxAttempts: 1})
		}
		outs, err := steps.GetAll(ctx, futures)
		if err != nil {
			return 0, err
		}
		sum := 0
		for _, o := range outs {
			sum += o
		}
		return sum, nil
	})
}

func TestParallelSteps(t *testing.T) {
	t.Parallel()
	k := idem.Key{Scope: "s", ID: "k"}

	t.Run("AHundredBranchesAtMostEightAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := &fanOut{}
		wf := f.define("fan")
		e := b.engine(t, fastConfig(wf))
		sum, err := wf.Run(b.ctx, e, k, fanIn{N: 100}, nil)
		require.NoError(t, err)
		require.Equal(t, 5050, sum)
		require.LessOrEqual(t, f.peak.Load(), int32(workflow.DefaultMaxParallelSteps))
		require.Greater(t, f.peak.Load(), int32(1), "branches ran at once")
		require.Equal(t, 100, b.count(t, `SELECT count(*) FROM effects WHERE run = 'fan'`))
		require.Equal(t, 100, b.count(t, `SELECT count(DISTINCT note) FROM effects WHERE run = 'fan'`), "each branch in a transaction of its own")
		run, err := e.RunGet(b.ctx, k)
		require.NoError(t, err)
		require.Len(t, run.Steps, 100)
		for i, s := range run.Steps {
			require.Equal(t, i+1, s.Seq)
			require.Equal(t, fmt.Sprintf("item %d", i+1), s.Name, "positions are taken in the workflow's order")
		}
		// A replay runs nothing.
		again, err := wf.Run(b.ctx, e, k, fanIn{N: 100}, nil)
		require.NoError(t, err)
		require.Equal(t, sum, again)
		require.Equal(t, 100, b.count(t, `SELECT count(*) FROM effects`))
	})

	t.Run("ABranchErrorComesBackAtWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := &fanOut{}
		wf := f.define("fails")
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, k, fanIn{N: 5, FailAt: 3}, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		require.ErrorContains(t, err, "out of stock")
		require.Equal(t, 4, b.count(t, `SELECT count(*) FROM effects`), "the other branches did their work, once")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_steps WHERE error IS NOT NULL`))
	})

	t.Run("ACrashMidFanOutRunsOnlyWhatDidNotComplete", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The first process completes three branches of six; the other three wait, and the
		// process dies.
		started := make(chan struct{}, 6)
		release := make(chan struct{})
		ctx, cancel := context.WithCancel(b.ctx)
		var done atomic.Int32
		dying := workflow.Define("fan", func(ctx context.Context, in fanIn) (int, error) {
			var fs []*steps.Future[int]
			for i := range in.N {
				fs = append(fs, steps.GoTx(ctx, fmt.Sprintf("item %d", i+1), func(ctx context.Context, tx pgx.Tx) (int, error) {
					started <- struct{}{}
					if i%2 == 1 { // items 2, 4, 6 wait for the crash
						select {
						case <-release:
						case <-ctx.Done():
						}
						return 0, ctx.Err()
					}
					done.Add(1)
					return i + 1, effect(ctx, tx, "fan", fmt.Sprintf("item %d", i+1), "")
				}, &steps.Opts{MaxAttempts: 1}))
			}
			_, err := steps.GetAll(ctx, fs)
			return 0, err
		})
		de := b.engine(t, fastConfig(dying))
		go func() {
			for range 6 {
				<-started
			}
			eventually(t, 10*time.Second, "the three quick branches to commit", func() bool {
				return b.count(t, `SELECT count(*) FROM idem_steps`) == 3
			})
			cancel()
		}()
		_, err := dying.Run(ctx, de, k, fanIn{N: 6}, nil)
		require.Error(t, err)
		require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`))
		b.waitLeaseExpired(t, k)

		f := &fanOut{}
		wf := f.define("fan")
		e := b.engine(t, fastConfig(wf))
		sum, err := wf.Run(b.ctx, e, k, fanIn{N: 6}, nil)
		require.NoError(t, err)
		require.Equal(t, 21, sum)
		for i := 1; i <= 6; i++ {
			require.Equal(t, 1, b.effects(t, fmt.Sprintf("item %d", i)), "item %d once", i)
		}
		require.Equal(t, int32(3), f.calls.Load(), "only the three that had not completed ran again")
	})

	t.Run("SelectRecordsItsChoice", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		slow := make(chan struct{})
		var calls atomic.Int32
		wf := workflow.Define("race", func(ctx context.Context, _ int) (string, error) {
			fast := steps.GoCall(ctx, "fast", func(context.Context, string) (string, error) {
				calls.Add(1)
				return "fast", nil
			}, nil)
			late := steps.GoCall(ctx, "slow", func(ctx context.Context, _ string) (string, error) {
				calls.Add(1)
				<-slow
				return "slow", nil
			}, nil)
			i, err := steps.Select(ctx, "first", fast, late)
			if err != nil {
				return "", err
			}
			close(slow) // let the slow one finish, so that a replay finds both completed
			if i == 0 {
				return fast.Get(ctx)
			}
			return late.Get(ctx)
		})
		e := b.engine(t, fastConfig(wf))
		out, err := wf.Run(b.ctx, e, k, 1, nil)
		require.NoError(t, err)
		require.Equal(t, "fast", out)
		run, err := e.RunGet(b.ctx, k)
		require.NoError(t, err)
		require.Len(t, run.Steps, 3)
		require.Equal(t, "select", run.Steps[2].Kind)
		require.JSONEq(t, `0`, string(run.Steps[2].Output))
		require.Equal(t, int32(2), calls.Load())
	})

	t.Run("RoundTripsPerBranch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		counter := &roundtrip.Counter{}
		cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
		require.NoError(t, err)
		cfg.ConnConfig.DialFunc, cfg.ConnConfig.Tracer = counter.Dial, counter
		// pgxpool pings a connection idle for a second before handing it out: a round trip that is
		// the pool's, not the run's.
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		// One connection: branches then take turns on it, and every statement is prepared on it
		// by the warm-up. (With several, a branch can land on a connection that meets a statement
		// for the first time and prepares it, a round trip that is the cache's, not the run's.)
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		wf := workflow.Define("fan10", func(ctx context.Context, _ int) (int, error) {
			var fs []*steps.Future[int]
			for i := range 10 {
				fs = append(fs, steps.GoTx(ctx, fmt.Sprintf("b%d", i), func(ctx context.Context, tx pgx.Tx) (int, error) {
					_, err := tx.Exec(ctx, `INSERT INTO effects (run, step) VALUES ('fan10', $1)`, fmt.Sprint(i))
					return i, err
				}, nil))
			}
			_, err := steps.GetAll(ctx, fs)
			return 0, err
		})
		e, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quietLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, e.Close()) })
		for i := range 5 { // warm the connections' statement caches
			_, err := wf.Run(b.ctx, e, idem.Key{Scope: "warm", ID: fmt.Sprint(i)}, i, nil)
			require.NoError(t, err)
		}
		trips := 1 << 30
		for i := range 3 {
			counter.Reset()
			_, err = wf.Run(b.ctx, e, idem.Key{Scope: "m", ID: fmt.Sprint(i)}, i, nil)
			require.NoError(t, err)
			n, _ := counter.Counts()
			trips = min(trips, n)
		}
		// The start (1) and its commit before the first branch (1), then each branch's
		// BEGIN+INSERT (1) and checkpoint+COMMIT (1), and the outcome (1).
		require.Equal(t, 3+2*10, trips, "2 round trips and 1 commit per branch")
	})
}
