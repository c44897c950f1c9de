package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/workflow"
)

func TestRunGet(t *testing.T) {
	t.Parallel()
	req := transferReq{Amount: 100, Note: "t"}

	t.Run("DoneRunWithSteps", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig(wf))
		key := idem.Key{Scope: "s", ID: "k1"}
		r, err := wf.Run(b.ctx, e, key, req, nil)
		require.NoError(t, err)

		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, "transfer", run.Workflow)
		require.Equal(t, workflow.RunStateDone, run.State)
		require.True(t, run.State.Finished())
		require.Equal(t, 1, run.Attempts)
		require.Empty(t, run.LeaseOwner)
		require.Nil(t, run.LeaseExpires)
		require.NotNil(t, run.Finished)
		require.NotNil(t, run.Expires)
		require.JSONEq(t, `{"amount":100,"note":"t"}`, string(run.Input))
		var out receiptOut
		require.NoError(t, json.Unmarshal(run.Output, &out))
		require.Equal(t, r.SettleID, out.SettleID)
		require.Len(t, run.Steps, 3)
		for i, want := range []struct{ name, kind string }{{"reserve", "tx"}, {"charge", "call"}, {"settle", "tx"}} {
			require.Equal(t, i+1, run.Steps[i].Seq)
			require.Equal(t, want.name, run.Steps[i].Name)
			require.Equal(t, want.kind, run.Steps[i].Kind)
			require.Equal(t, 1, run.Steps[i].Attempts)
			require.Empty(t, run.Steps[i].Error)
			require.False(t, run.Steps[i].Created.IsZero())
		}
		require.JSONEq(t, fmt.Sprint(r.ReserveID), string(run.Steps[0].Output))
		_, err = json.Marshal(run)
		require.NoError(t, err)
	})

	t.Run("RunningRunShowsItsOwner", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := idem.Key{Scope: "s", ID: "k1"}
		at, release := blockAt("in:settle")
		wf := newTransfer(b.pool, at.hooks)
		e := b.engine(t, fastConfig(wf))
		done := make(chan error, 1)
		go func() {
			_, err := wf.Run(b.ctx, e, key, req, nil)
			done <- err
		}()
		<-at.reached
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateRunning, run.State)
		require.False(t, run.State.Finished())
		require.NotEmpty(t, run.LeaseOwner)
		require.NotNil(t, run.LeaseExpires)
		require.Len(t, run.Steps, 1, "settle has not committed; charge's checkpoint goes with it")
		release()
		require.NoError(t, <-done)
	})

	t.Run("FailedStep", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fl := newFlaky(b)
		fl.broken.Store(true)
		e := b.engine(t, fastConfig(fl.wf))
		key := idem.Key{Scope: "s", ID: "k1"}
		_, err := fl.wf.Run(b.ctx, e, key, 1, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateFailed, run.State)
		require.Contains(t, run.Error, "b is broken")
		require.Len(t, run.Steps, 2)
		require.Contains(t, run.Steps[1].Error, "b is broken")
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e := b.engine(t, fastConfig())
		_, err := e.RunGet(b.ctx, idem.Key{Scope: "s", ID: "nope"})
		require.ErrorIs(t, err, idem.ErrNotFound)
		_, err = idem.Run(b.ctx, b.pool, idem.Key{Scope: "s", ID: "do"}, func(context.Context, pgxTx) (int, error) { return 1, nil })
		require.NoError(t, err)
		_, err = e.RunGet(b.ctx, idem.Key{Scope: "s", ID: "do"})
		require.ErrorIs(t, err, idem.ErrNotFound)
		require.ErrorContains(t, err, "idem.Do")
	})
}

type receiptOut struct {
	SettleID int64 `json:"settle_id"`
}

func TestRunList(t *testing.T) {
	t.Parallel()

	// seed writes n runs straight into idem_runs: 5 at each second in the past, so that the
	// order also depends on (scope, id), across 3 scopes, 2 workflows and 3 states.
	seed := func(t *testing.T, b *testBundle, n int) {
		t.Helper()
		_, err := b.pool.Exec(b.ctx, `
INSERT INTO idem_runs (scope, id, workflow, state, created_at, updated_at)
SELECT 's' || (i % 3), 'r' || lpad(i::text, 4, '0'), CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END,
	(ARRAY['running', 'done', 'failed'])[i % 3 + 1], now() - interval '1 hour' - ((i - 1) / 5) * interval '1 second', now()
FROM generate_series(1, $1) i`, n)
		require.NoError(t, err)
	}

	t.Run("Filters", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b, 60)
		e := b.engine(t, fastConfig())
		list := func(p *workflow.RunListParams) []*workflow.RunRow {
			t.Helper()
			res, err := e.RunList(b.ctx, p)
			require.NoError(t, err)
			require.Empty(t, res.Next)
			return res.Runs
		}
		require.Len(t, list(nil), 60)
		failed := list(&workflow.RunListParams{States: []workflow.RunState{workflow.RunStateFailed}})
		require.Len(t, failed, 20)
		for _, r := range failed {
			require.Equal(t, workflow.RunStateFailed, r.State)
		}
		require.Len(t, list(&workflow.RunListParams{States: []workflow.RunState{workflow.RunStateFailed, workflow.RunStateRunning}}), 40)
		require.Len(t, list(&workflow.RunListParams{Workflows: []string{"even"}}), 30)
		require.Len(t, list(&workflow.RunListParams{Scope: "s1", Workflows: []string{"odd"}}), 10)
		require.Empty(t, list(&workflow.RunListParams{Scope: "other"}))

		all := list(nil)
		since := all[9].Created // the 10 newest, 5 to a second: two whole seconds
		require.Len(t, list(&workflow.RunListParams{Since: since}), 10)
		require.Len(t, list(&workflow.RunListParams{Until: since}), 50)
		require.Len(t, list(&workflow.RunListParams{Since: all[19].Created, Until: since}), 10)
	})

	t.Run("PageBounds", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b, 120)
		e := b.engine(t, fastConfig())
		res, err := e.RunList(b.ctx, nil)
		require.NoError(t, err)
		require.Len(t, res.Runs, workflow.DefaultRunListLimit)
		require.NotEmpty(t, res.Next)
		res, err = e.RunList(b.ctx, &workflow.RunListParams{After: res.Next})
		require.NoError(t, err)
		require.Len(t, res.Runs, 20)
		require.Empty(t, res.Next)

		_, err = e.RunList(b.ctx, &workflow.RunListParams{Limit: workflow.MaxRunListLimit + 1})
		require.ErrorContains(t, err, "Limit cannot be more than 1000")
		_, err = e.RunList(b.ctx, &workflow.RunListParams{Limit: -1})
		require.ErrorContains(t, err, "Limit cannot be negative")
		_, err = e.RunList(b.ctx, &workflow.RunListParams{After: "not-a-cursor"})
		require.ErrorContains(t, err, "After")
		res, err = e.RunList(b.ctx, &workflow.RunListParams{Limit: workflow.MaxRunListLimit})
		require.NoError(t, err)
		require.Len(t, res.Runs, 120)
	})

	// Paging through the runs while another goroutine adds runs as fast as it can: every run
	// that existed at the start is seen, none twice, in one order across pages. (Runs added
	// after a page was read are newer than its cursor, so later pages cannot show them.)
	t.Run("CursorStableUnderInserts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b, 203)
		e := b.engine(t, fastConfig())
		ctx, stop := context.WithCancel(b.ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		var added atomic.Int64
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				_, err := b.pool.Exec(ctx, `INSERT INTO idem_runs (scope, id, workflow, state) VALUES ('s0', $1, 'new', 'running')`, fmt.Sprintf("new-%d", i))
				if err == nil {
					added.Add(1)
				}
			}
		}()
		seen := map[string]bool{}
		var prev *workflow.RunRow
		p := &workflow.RunListParams{Limit: 7, Workflows: []string{"even", "odd", "new"}}
		for {
			res, err := e.RunList(b.ctx, p)
			require.NoError(t, err)
			for _, r := range res.Runs {
				require.False(t, seen[r.Scope+"/"+r.ID], "run %s listed twice", r.ID)
				seen[r.Scope+"/"+r.ID] = true
				if prev != nil {
					require.True(t, r.Created.Before(prev.Created) || (r.Created.Equal(prev.Created) && (r.Scope < prev.Scope || (r.Scope == prev.Scope && r.ID < prev.ID))),
						"newest first, then by scope and id descending, across pages")
				}
				prev = r
			}
			if res.Next == "" {
				break
			}
			p.After = res.Next
			// At least one run is added between any two pages.
			for before := added.Load(); added.Load() == before; {
				time.Sleep(time.Millisecond)
			}
		}
		stop()
		wg.Wait()
		for i := 1; i <= 203; i++ {
			id := fmt.Sprintf("s%d/r%04d", i%3, i)
			require.True(t, seen[id], "run %s, there from the start, was skipped", id)
		}
		require.Positive(t, added.Load())
	})
}

func TestWorkflowGet(t *testing.T) {
	t.Parallel()
	req := transferReq{Amount: 100, Note: "t"}

	// A run whose owner died: Get reports it in flight and takes nothing over, where Run would
	// continue it.
	t.Run("NeverRunsAnything", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(b.ctx)
		wf := newTransfer(b.pool, crashOnceAt("before:settle", cancel))
		e := b.engine(t, fastConfig(wf))
		key := idem.Key{Scope: "s", ID: "k1"}
		_, err := wf.Run(ctx, e, key, req, nil)
		require.Error(t, err)

		_, err = wf.Get(b.ctx, e, key)
		var inflight *idem.InFlightError
		require.ErrorAs(t, err, &inflight)
		require.GreaterOrEqual(t, inflight.RetryAfter, time.Second)

		b.waitLeaseExpired(t, key)
		for range 3 {
			_, err = wf.Get(b.ctx, e, key)
			require.ErrorIs(t, err, idem.ErrInFlight)
		}
		state, attempts := b.state(t, key)
		require.Equal(t, "running", state)
		require.Equal(t, 1, attempts, "no takeover")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM calls`), "no step ran")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_steps`))

		r, err := wf.Run(b.ctx, e, key, req, nil)
		require.NoError(t, err)
		got, err := wf.Get(b.ctx, e, key)
		require.NoError(t, err)
		require.Equal(t, r, got)
		b.checkTransfer(t, r)
	})

	t.Run("FailedNotFoundAndMismatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fl := newFlaky(b)
		fl.broken.Store(true)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig(fl.wf, wf))
		key := idem.Key{Scope: "s", ID: "k1"}
		_, err := fl.wf.Run(b.ctx, e, key, 1, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		_, err = fl.wf.Get(b.ctx, e, key)
		var failed *workflow.FailedError
		require.ErrorAs(t, err, &failed)
		require.Contains(t, failed.Message, "b is broken")

		_, err = wf.Get(b.ctx, e, key)
		require.ErrorIs(t, err, idem.ErrMismatch)
		_, err = wf.Get(b.ctx, e, idem.Key{Scope: "s", ID: "nope"})
		require.ErrorIs(t, err, idem.ErrNotFound)
		doKey := idem.Key{Scope: "s", ID: "a-do-key"}
		_, err = idem.Run(b.ctx, b.pool, doKey, func(context.Context, pgx.Tx) (int, error) { return 1, nil })
		require.NoError(t, err)
		_, err = wf.Get(b.ctx, e, doKey)
		require.ErrorIs(t, err, idem.ErrNotFound)
		require.ErrorContains(t, err, "belongs to idem.Do", "a key of Do's says so")
		require.Equal(t, 1, int(fl.runs["a"].Load()))
		require.Equal(t, 3, int(fl.runs["b"].Load()), "b ran its attempts in the Run, none in the Gets")
		require.False(t, errors.Is(err, idem.ErrInFlight))
	})
}
