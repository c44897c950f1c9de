package workflow_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// attrWorkflow sets attributes from its steps: "stage" in its first Tx step (whose first attempt
// fails after setting a "doomed" attribute, which must roll back with it), and removes "drop"
// in its second.
func attrWorkflow(failFirst *atomic.Bool) *workflow.Workflow[string, string] {
	return workflow.Define("attrs", func(ctx context.Context, in string) (string, error) {
		_, err := steps.Tx(ctx, "stage", func(ctx context.Context, t pgx.Tx) (int, error) {
			if failFirst.CompareAndSwap(true, false) {
				if err := workflow.SetAttributesTx(ctx, t, map[string]string{"doomed": "yes"}); err != nil {
					return 0, err
				}
				return 0, errBoom
			}
			return 1, workflow.SetAttributesTx(ctx, t, map[string]string{"stage": "reserved", "customer": "c-2"})
		}, &workflow.StepOpts{MinBackoff: 1})
		if err != nil {
			return "", err
		}
		_, err = steps.Tx(ctx, "finish", func(ctx context.Context, t pgx.Tx) (int, error) {
			return 2, workflow.SetAttributesTx(ctx, t, map[string]string{"drop": "", "stage": "done"})
		}, nil)
		return in, err
	})
}

func TestAttributes(t *testing.T) {
	t.Parallel()

	t.Run("StartAndSteps", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var failFirst atomic.Bool
		failFirst.Store(true)
		wf := attrWorkflow(&failFirst)
		e := b.engine(t, fastConfig(wf))
		key := idem.Key{Scope: "s", ID: "k1"}
		out, err := wf.Run(b.ctx, e, key, "x", &workflow.RunOpts{Attributes: map[string]string{"customer": "c-1", "drop": "me", "region": "eu"}})
		require.NoError(t, err)
		require.Equal(t, "x", out)

		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		// The failed attempt's "doomed" rolled back with it; the step replaced customer, the
		// second step removed drop and replaced stage.
		require.Equal(t, map[string]string{"customer": "c-2", "region": "eu", "stage": "done"}, run.Attributes)

		// A replay runs no step, and changes nothing.
		_, err = b.pool.Exec(b.ctx, `UPDATE idem_runs SET attributes = attributes || '{"operator":"note"}'`)
		require.NoError(t, err)
		_, err = wf.Run(b.ctx, e, key, "x", nil)
		require.NoError(t, err)
		run, err = e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, "note", run.Attributes["operator"])
		require.Equal(t, "done", run.Attributes["stage"])
	})

	t.Run("StartTx", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := newTransfer(b.pool, nil)
		e := b.engine(t, fastConfig(wf))
		b.startRiver(t, e)
		key := idem.Key{Scope: "s", ID: "bg"}
		require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			return wf.StartTx(b.ctx, e, tx, key, transferReq{Amount: 1, Note: "bg"}, &workflow.StartOpts{Attributes: map[string]string{"customer": "c-9"}})
		}))
		require.Equal(t, "done", b.waitFinished(t, key))
		run, err := e.RunGet(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, map[string]string{"customer": "c-9"}, run.Attributes)

		// A fork carries them.
		forked := idem.Key{Scope: "s", ID: "bg-fork"}
		require.NoError(t, e.RunFork(b.ctx, key, forked, 2))
		require.Equal(t, "done", b.waitFinished(t, forked))
		run, err = e.RunGet(b.ctx, forked)
		require.NoError(t, err)
		require.Equal(t, map[string]string{"customer": "c-9"}, run.Attributes)

		err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			return wf.StartTx(b.ctx, e, tx, idem.Key{Scope: "s", ID: "two"}, transferReq{}, &workflow.StartOpts{}, &workflow.StartOpts{})
		})
		require.ErrorContains(t, err, "at most one *StartOpts")
	})

	t.Run("RunListFilters", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := workflow.Define("echo", func(ctx context.Context, in string) (string, error) { return in, nil })
		e := b.engine(t, fastConfig(wf))
		for i := range 6 {
			attrs := map[string]string{"customer": "c-" + strconv.Itoa(i%3), "parity": []string{"even", "odd"}[i%2]}
			_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "r" + strconv.Itoa(i)}, "x", &workflow.RunOpts{Attributes: attrs})
			require.NoError(t, err)
		}
		_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "none"}, "x", nil)
		require.NoError(t, err)

		ids := func(attrs map[string]string) []string {
			res, err := e.RunList(b.ctx, &workflow.RunListParams{Attributes: attrs})
			require.NoError(t, err)
			var ids []string
			for _, r := range res.Runs {
				ids = append(ids, r.ID)
			}
			return ids
		}
		require.Equal(t, []string{"r3", "r0"}, ids(map[string]string{"customer": "c-0"}))
		require.Equal(t, []string{"r3"}, ids(map[string]string{"customer": "c-0", "parity": "odd"}))
		require.Empty(t, ids(map[string]string{"customer": "c-9"}))
		require.Len(t, ids(nil), 7)

		_, err = e.RunList(b.ctx, &workflow.RunListParams{Attributes: map[string]string{"k\x00": "v"}})
		require.ErrorContains(t, err, `RunListParams.Attributes key "k\x00" has control character U+0000`)
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := workflow.Define("echo", func(ctx context.Context, in string) (string, error) { return in, nil })
		e := b.engine(t, fastConfig(wf))
		many := map[string]string{}
		for i := range workflow.MaxAttributes + 1 {
			many["k"+strconv.Itoa(i)] = "v"
		}
		for _, c := range []struct {
			attrs map[string]string
			want  string
		}{
			{many, "RunOpts.Attributes has 33 attributes; a run can have at most 32"},
			{map[string]string{"": "v"}, "RunOpts.Attributes has an empty key"},
			{map[string]string{strings.Repeat("k", 65): "v"}, "is 65 bytes; a key can be at most 64"},
			{map[string]string{"k": strings.Repeat("v", 257)}, `value of "k" is 257 bytes; a value can be at most 256`},
			{map[string]string{"k": ""}, `value of "k" is empty; leave the key out instead`},
			{map[string]string{"k": "a\nb"}, `value of "k" has control character U+000A`},
			{map[string]string{"k": "\xff"}, `value of "k" is not valid UTF-8`},
		} {
			_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "bad"}, "x", &workflow.RunOpts{Attributes: c.attrs})
			require.ErrorContains(t, err, c.want)
		}
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs`), "a refused run leaves nothing")
	})

	t.Run("SetAttributesTxLimitsAndMisuse", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var attempts atomic.Int32
		tooMany := workflow.Define("too-many", func(ctx context.Context, in int) (int, error) {
			return steps.Tx(ctx, "set", func(ctx context.Context, t pgx.Tx) (int, error) {
				attempts.Add(1)
				attrs := map[string]string{}
				for i := range in {
					attrs["k"+strconv.Itoa(i)] = "v"
				}
				return 0, workflow.SetAttributesTx(ctx, t, attrs)
			}, &workflow.StepOpts{MinBackoff: 1})
		})
		var misuse error
		wrongTx := workflow.Define("wrong-tx", func(ctx context.Context, in int) (int, error) {
			misuse = workflow.SetAttributesTx(ctx, nil, map[string]string{"a": "b"})
			return steps.Tx(ctx, "own", func(ctx context.Context, t pgx.Tx) (int, error) {
				other, err := b.pool.Begin(ctx)
				if err != nil {
					return 0, err
				}
				defer func() { _ = other.Rollback(context.Background()) }()
				return 0, workflow.SetAttributesTx(ctx, other, map[string]string{"a": "b"})
			}, &workflow.StepOpts{MaxAttempts: 1})
		})
		e := b.engine(t, fastConfig(tooMany, wrongTx))

		// 31 at start and 2 from the step: 33, over the limit, refused once and not retried.
		start := map[string]string{}
		for i := range workflow.MaxAttributes - 1 {
			start["s"+strconv.Itoa(i)] = "v"
		}
		_, err := tooMany.Run(b.ctx, e, idem.Key{Scope: "s", ID: "many"}, 2, &workflow.RunOpts{Attributes: start})
		require.ErrorIs(t, err, workflow.ErrFailed)
		require.ErrorContains(t, err, "would leave the run with 33 attributes; a run can have at most 32")
		require.Equal(t, int32(1), attempts.Load(), "a limit is not worth a retry")
		run, err := e.RunGet(b.ctx, idem.Key{Scope: "s", ID: "many"})
		require.NoError(t, err)
		require.Len(t, run.Attributes, workflow.MaxAttributes-1)

		_, err = wrongTx.Run(b.ctx, e, idem.Key{Scope: "s", ID: "wrong"}, 1, nil)
		require.ErrorContains(t, err, "SetAttributesTx needs the transaction its Tx step received")
		require.ErrorContains(t, misuse, "SetAttributesTx needs the transaction its Tx step received")

		err = workflow.SetAttributesTx(b.ctx, nil, map[string]string{"a": "b"})
		require.ErrorContains(t, err, "SetAttributesTx was called outside a workflow")
		require.False(t, errors.Is(err, workflow.ErrLeaseLost))
	})
}

// TestAttributesInABranchAreRefused: SetAttributesTx in a parallel branch's transaction
// (steps.GoTx) is refused, saying so, rather than with a complaint about the transaction it was
// handed.
func TestAttributesInABranchAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.Define("branch-attrs", func(ctx context.Context, in int) (int, error) {
		f := steps.GoTx(ctx, "tag", func(ctx context.Context, tx pgx.Tx) (int, error) {
			return 1, workflow.SetAttributesTx(ctx, tx, map[string]string{"stage": "tagged"})
		}, &steps.Opts{MaxAttempts: 1})
		return f.Get(ctx)
	})
	e := b.engine(t, fastConfig(wf))
	_, err := wf.Run(b.ctx, e, idem.Key{Scope: "s", ID: "k"}, 1, nil)
	require.ErrorContains(t, err, `SetAttributesTx was called in step "tag", a parallel branch (steps.GoTx); set attributes in a steps.Tx of the workflow's own line`)
}
