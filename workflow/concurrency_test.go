package workflow_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

type payoutIn struct {
	Account string `json:"account"`
	N       int    `json:"n"`
}

// newLimited is a workflow limited to limit active runs per account. Each of its steps records,
// in its own transaction, how many runs of its account are active right then (as the database
// sees it); a sleep in the middle keeps the slot while the run holds nothing.
func newLimited(b *testBundle, limit int, sleep time.Duration) *workflow.Workflow[payoutIn, int] {
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE IF NOT EXISTS seen (id bigserial PRIMARY KEY, account text, run int, active int)`)
	if err != nil {
		panic(err)
	}
	record := func(ctx context.Context, tx pgx.Tx, in payoutIn) (int, error) {
		var active int
		err := tx.QueryRow(ctx, `
INSERT INTO seen (account, run, active)
SELECT $1, $2, count(*) FROM idem_runs WHERE workflow = 'payout' AND concurrency_key = $1 AND state IN ('running', 'sleeping', 'awaiting')
RETURNING active`, in.Account, in.N).Scan(&active)
		return active, err
	}
	return workflow.Define("payout", func(ctx context.Context, in payoutIn) (int, error) {
		if _, err := steps.Tx(ctx, "reserve", func(ctx context.Context, tx pgx.Tx) (int, error) { return record(ctx, tx, in) }, nil); err != nil {
			return 0, err
		}
		if sleep > 0 {
			if err := steps.Sleep(ctx, "cool-off", sleep); err != nil {
				return 0, err
			}
		}
		if _, err := steps.Call(ctx, "transfer", func(context.Context, string) (int, error) { return in.N, nil }, nil); err != nil {
			return 0, err
		}
		return steps.Tx(ctx, "settle", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := record(ctx, tx, in); err != nil {
				return 0, err
			}
			return in.N, nil
		}, nil)
	}).WithConcurrency(limit, func(in payoutIn) string { return in.Account })
}

func TestConcurrencyKey(t *testing.T) {
	t.Parallel()

	t.Run("ThirtyTwoStartsOneAtATime", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newLimited(b, 1, 0)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: fmt.Sprintf("payout-%d", i)}, payoutIn{Account: "acct-1", N: i},
					&workflow.RunOpts{Wait: 60 * time.Second})
				if err == nil && out != i {
					err = fmt.Errorf("run %d returned %d", i, out)
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, 64, b.count(t, `SELECT count(*) FROM seen`), "every run recorded both its steps")
		require.Equal(t, 1, b.count(t, `SELECT max(active) FROM seen`), "never two runs of one account active at once")
		require.Equal(t, 32, b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'done'`))
	})

	t.Run("FIFOAndOtherKeysAreFree", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newLimited(b, 1, time.Hour) // each run sleeps, keeping its slot
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		run := func(id, account string, n int) error {
			_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: id}, payoutIn{Account: account, N: n}, nil)
			return err
		}
		require.ErrorIs(t, run("a1", "a", 1), idem.ErrInFlight) // sleeps, holding account a's slot
		for i, id := range []string{"a2", "a3", "a4"} {
			require.ErrorIs(t, run(id, "a", 2+i), idem.ErrInFlight) // queued, in this order
			time.Sleep(5 * time.Millisecond)
		}
		require.ErrorIs(t, run("b1", "b", 9), idem.ErrInFlight) // another account: not queued
		states := func() string {
			var out []string
			for _, id := range []string{"a1", "a2", "a3", "a4", "b1"} {
				s, _ := b.state(t, idem.Key{Scope: "s", ID: id})
				out = append(out, s)
			}
			return strings.Join(out, " ")
		}
		eventually(t, 10*time.Second, "b1 to sleep", func() bool { return states() == "sleeping queued queued queued sleeping" })
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM seen WHERE account = 'a'`), "queued runs ran no code")

		// Cancelling the sleeper frees its slot: the oldest queued run starts, woken by a job.
		require.NoError(t, e.RunCancel(b.ctx, idem.Key{Scope: "s", ID: "a1"}, "stop"))
		eventually(t, 10*time.Second, "a2 to start and sleep", func() bool { return states() == "cancelled sleeping queued queued sleeping" })
		// A queued run cancelled frees nothing; the next active one's end starts a4, not a3.
		require.NoError(t, e.RunCancel(b.ctx, idem.Key{Scope: "s", ID: "a3"}, "withdrawn"))
		require.Equal(t, "cancelled sleeping cancelled queued sleeping", states())
		require.NoError(t, e.RunCancel(b.ctx, idem.Key{Scope: "s", ID: "a2"}, "stop"))
		eventually(t, 10*time.Second, "a4 to start", func() bool { return states() == "cancelled cancelled cancelled sleeping sleeping" })
		require.Equal(t, 1, b.count(t, `SELECT max(active) FROM seen`))
	})

	t.Run("StartTxQueuesToo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newLimited(b, 2, 0)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		require.NoError(t, b.inTx(func(ctx context.Context, tx pgx.Tx) error {
			for i := range 6 {
				if err := wf.StartTx(ctx, e, tx, idem.Key{Scope: "s", ID: fmt.Sprint("bg-", i)}, payoutIn{Account: "x", N: i}); err != nil {
					return err
				}
			}
			return nil
		}))
		eventually(t, 30*time.Second, "all six to finish", func() bool {
			return b.count(t, `SELECT count(*) FROM idem_runs WHERE state = 'done'`) == 6
		})
		require.LessOrEqual(t, b.count(t, `SELECT max(active) FROM seen`), 2)
	})

	t.Run("BadKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		long := workflow.Define("long", func(ctx context.Context, in string) (int, error) { return 1, nil }).
			WithConcurrency(1, func(in string) string { return in })
		e := b.engine(t, fastConfig(long))
		_, err := long.Run(b.ctx, e, idem.Key{Scope: "s", ID: "k"}, strings.Repeat("k", 201), nil)
		require.ErrorContains(t, err, "cannot be longer than 200")
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs`))
		require.Panics(t, func() {
			workflow.Define("zero", func(context.Context, int) (int, error) { return 0, nil }).WithConcurrency(0, nil)
		})
	})
}
