package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// family is a parent workflow and its children, counting in SQL each time a child's function
// runs.
type family struct {
	b      *testBundle
	child  *workflow.Workflow[childIn, string]
	parent *workflow.Workflow[parentIn, []string]
}

type childIn struct {
	Name  string `json:"name"`
	Await bool   `json:"await,omitempty"` // wait for the signal "go" before finishing
	Fail  bool   `json:"fail,omitempty"`
}

type parentIn struct {
	Children []childIn `json:"children"`
	Abandon  bool      `json:"abandon,omitempty"`
	Detached bool      `json:"detached,omitempty"` // start them all, then wait for each
}

func newFamily(b *testBundle) *family {
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE IF NOT EXISTS child_runs (id bigserial PRIMARY KEY, name text NOT NULL)`)
	if err != nil {
		panic(err)
	}
	f := &family{b: b}
	f.child = workflow.Define("child", func(ctx context.Context, in childIn) (string, error) {
		if _, err := b.pool.Exec(context.WithoutCancel(ctx), `INSERT INTO child_runs (name) VALUES ($1)`, in.Name); err != nil {
			return "", err
		}
		if in.Await {
			if _, err := steps.Await[string](ctx, "wait", "go", 0); err != nil {
				return "", err
			}
		}
		if in.Fail {
			return "", errors.New("child " + in.Name + " gave up")
		}
		return steps.Tx(ctx, "work", func(ctx context.Context, tx pgx.Tx) (string, error) {
			return in.Name + " done", effect(ctx, tx, in.Name, "work", "")
		}, nil)
	})
	f.parent = workflow.Define("parent", func(ctx context.Context, in parentIn) ([]string, error) {
		var outs []string
		if in.Detached {
			var started []*workflow.ChildRun[string]
			for _, c := range in.Children {
				run, err := steps.StartChild(ctx, "start "+c.Name, f.child, c, &workflow.ChildOpts{Abandon: in.Abandon})
				if err != nil {
					return nil, err
				}
				started = append(started, run)
			}
			for i, run := range started {
				out, err := run.Wait(ctx, "wait "+in.Children[i].Name)
				if err != nil {
					return nil, err
				}
				outs = append(outs, out)
			}
			return outs, nil
		}
		for _, c := range in.Children {
			out, err := steps.Child(ctx, c.Name, f.child, c, &workflow.ChildOpts{Abandon: in.Abandon})
			if err != nil {
				return nil, err
			}
			outs = append(outs, out)
		}
		return outs, nil
	})
	return f
}

// childRuns counts the child's work, a Tx step: once per child, however often its function ran
// (a child that waits runs its code again when it is woken).
func (f *family) childRuns(t testing.TB, name string) int {
	return f.b.count(t, `SELECT count(*) FROM effects WHERE run = $1`, name)
}

func (f *family) signal(t testing.TB, e *workflow.Engine, key idem.Key) {
	t.Helper()
	require.NoError(t, f.b.inTx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := e.SignalTx(ctx, tx, key, "go", "now", nil)
		return err
	}))
}

// childKey finds the key of the child the parent's step seq started.
func childKey(t testing.TB, e *workflow.Engine, parent idem.Key, name string) idem.Key {
	t.Helper()
	run, err := e.RunGet(context.Background(), parent)
	require.NoError(t, err)
	for _, c := range run.Children {
		for _, s := range run.Steps {
			if s.Seq == c.Seq && s.Name == name {
				return c.Key
			}
		}
	}
	t.Fatalf("no child of step %q in %+v", name, run.Children)
	return idem.Key{}
}

func TestChildWorkflows(t *testing.T) {
	t.Parallel()
	parentKey := idem.Key{Scope: "merchant:7", ID: "order-1"}

	t.Run("RunsAndReturnsItsOutput", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := newFamily(b)
		e := b.engine(t, fastConfig(f.parent, f.child))
		b.startRiver(t, e)
		out, err := runUntilDone(t, b, f.parent, e, parentKey, parentIn{Children: []childIn{{Name: "pay"}, {Name: "ship"}}})
		require.NoError(t, err)
		require.Equal(t, []string{"pay done", "ship done"}, out)
		require.Equal(t, 1, f.childRuns(t, "pay"))
		require.Equal(t, 1, f.childRuns(t, "ship"))

		parent, err := e.RunGet(b.ctx, parentKey)
		require.NoError(t, err)
		require.Len(t, parent.Children, 2)
		require.Nil(t, parent.Parent)
		pay := childKey(t, e, parentKey, "pay")
		require.Equal(t, parentKey.Scope, pay.Scope, "a child lives in its parent's scope")
		child, err := e.RunGet(b.ctx, pay)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateDone, child.State)
		require.NotNil(t, child.Parent)
		require.Equal(t, parentKey, child.Parent.Key)
		require.Equal(t, 1, child.Parent.Seq)

		page, err := e.RunList(b.ctx, &workflow.RunListParams{Parent: &parentKey})
		require.NoError(t, err)
		require.Len(t, page.Runs, 2)
		out2, err := f.child.Get(b.ctx, e, pay)
		require.NoError(t, err)
		require.Equal(t, "pay done", out2)

		// A replay of the parent starts nothing.
		out, err = f.parent.Run(b.ctx, e, parentKey, parentIn{Children: []childIn{{Name: "pay"}, {Name: "ship"}}}, nil)
		require.NoError(t, err)
		require.Equal(t, []string{"pay done", "ship done"}, out)
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_runs WHERE parent_id IS NOT NULL`))
	})

	t.Run("AWaitingParentHoldsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := newFamily(b)
		e := b.engine(t, fastConfig(f.parent, f.child))
		b.startRiver(t, e)
		in := parentIn{Children: []childIn{{Name: "slow", Await: true}}}
		_, err := f.parent.Run(b.ctx, e, parentKey, in, nil)
		require.ErrorIs(t, err, idem.ErrInFlight, "the parent waits for its child, suspended")
		eventually(t, 10*time.Second, "the child to await its signal", func() bool {
			return b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'child' AND state = 'awaiting'`) == 1
		})
		var state string
		var owner *string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT state, lease_owner FROM idem_runs WHERE id = $1`, parentKey.ID).Scan(&state, &owner))
		require.Equal(t, "awaiting", state)
		require.Nil(t, owner, "no lease while it waits")

		f.signal(t, e, childKey(t, e, parentKey, "slow"))
		require.Equal(t, "done", b.waitFinished(t, parentKey), "the child's end woke the parent")
		out, err := f.parent.Run(b.ctx, e, parentKey, in, nil)
		require.NoError(t, err)
		require.Equal(t, []string{"slow done"}, out)
		require.Equal(t, 1, f.childRuns(t, "slow"))
	})

	t.Run("StartedNowWaitedForLater", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := newFamily(b)
		e := b.engine(t, fastConfig(f.parent, f.child))
		b.startRiver(t, e)
		out, err := runUntilDone(t, b, f.parent, e, parentKey, parentIn{Detached: true, Children: []childIn{{Name: "a"}, {Name: "b"}, {Name: "c"}}})
		require.NoError(t, err)
		require.Equal(t, []string{"a done", "b done", "c done"}, out)
		for _, n := range []string{"a", "b", "c"} {
			require.Equal(t, 1, f.childRuns(t, n))
		}
	})

	t.Run("AFailedChildIsTheParentsError", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := newFamily(b)
		e := b.engine(t, fastConfig(f.parent, f.child))
		b.startRiver(t, e)
		_, err := runUntilDone(t, b, f.parent, e, parentKey, parentIn{Children: []childIn{{Name: "bad", Fail: true}}})
		require.ErrorIs(t, err, workflow.ErrFailed)
		require.ErrorContains(t, err, "child bad gave up")
	})

	t.Run("CancelCascades", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := newFamily(b)
		e := b.engine(t, fastConfig(f.parent, f.child))
		b.startRiver(t, e)
		in := parentIn{Detached: true, Children: []childIn{{Name: "x", Await: true}, {Name: "y", Await: true}}}
		_, err := f.parent.Run(b.ctx, e, parentKey, in, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		eventually(t, 10*time.Second, "both children to wait", func() bool {
			return b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'child' AND state = 'awaiting'`) == 2
		})
		require.NoError(t, e.RunCancel(b.ctx, parentKey, "order withdrawn"))
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'child' AND state = 'cancelled'`))
		x, err := e.RunGet(b.ctx, childKey(t, e, parentKey, "start x"))
		require.NoError(t, err)
		require.Contains(t, x.Error, "cancelled with its parent run")
		require.Zero(t, b.count(t, `SELECT count(*) FROM effects`))
	})

	t.Run("AbandonedChildrenGoOn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := newFamily(b)
		e := b.engine(t, fastConfig(f.parent, f.child))
		b.startRiver(t, e)
		in := parentIn{Detached: true, Abandon: true, Children: []childIn{{Name: "z", Await: true}}}
		_, err := f.parent.Run(b.ctx, e, parentKey, in, nil)
		require.ErrorIs(t, err, idem.ErrInFlight)
		eventually(t, 10*time.Second, "the child to wait", func() bool {
			return b.count(t, `SELECT count(*) FROM idem_runs WHERE workflow = 'child' AND state = 'awaiting'`) == 1
		})
		require.NoError(t, e.RunCancel(b.ctx, parentKey, "order withdrawn"))
		z := childKey(t, e, parentKey, "start z")
		state, _ := b.state(t, z)
		require.Equal(t, "awaiting", state, "an abandoned child is not cancelled")
		f.signal(t, e, z)
		require.Equal(t, "done", b.waitFinished(t, z))
		state, _ = b.state(t, parentKey)
		require.Equal(t, "cancelled", state, "its end does not bring the parent back")
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := newFamily(b)
		stranger := workflow.Define("stranger", func(ctx context.Context, _ int) (int, error) { return 1, nil })
		own := workflow.Define("own", func(ctx context.Context, _ int) (string, error) {
			return f.child.RunChild(ctx, "self", childIn{Name: "self"}, &workflow.ChildOpts{ID: "own-key"})
		})
		calls := workflow.Define("calls-stranger", func(ctx context.Context, _ int) (int, error) {
			return stranger.RunChild(ctx, "s", 1, nil)
		})
		e := b.engine(t, fastConfig(f.parent, f.child, own, calls))
		b.startRiver(t, e)
		_, err := calls.Run(b.ctx, e, idem.Key{Scope: "s", ID: "1"}, 1, nil)
		require.ErrorContains(t, err, `child workflow "stranger" is not registered with this engine`)
		_, err = own.Run(b.ctx, e, idem.Key{Scope: "s", ID: "own-key"}, 1, nil)
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.ErrorContains(t, err, "its parent's own key")
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_runs WHERE parent_id IS NOT NULL`), "no child was started")
	})
}

// TestChildrenSurviveTheParentsCrash checks that a parent whose process dies while its children
// run is resumed, replays the steps that started them (starting nothing), and collects their
// outcomes.
func TestChildrenSurviveTheParentsCrash(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newFamily(b)
	key := idem.Key{Scope: "merchant:7", ID: "crashing-parent"}
	// The parent's process dies right after its start steps committed: in a Call step after them.
	ctx, cancel := context.WithCancel(b.ctx)
	crashing := workflow.Define("parent", func(ctx context.Context, in parentIn) ([]string, error) {
		for _, c := range in.Children {
			if _, err := steps.StartChild(ctx, "start "+c.Name, f.child, c, nil); err != nil {
				return nil, err
			}
		}
		if _, err := steps.Call(ctx, "between", func(ctx context.Context, _ string) (int, error) {
			cancel() // the process dies here, its children started
			<-ctx.Done()
			return 0, ctx.Err()
		}, nil); err != nil {
			return nil, err
		}
		return nil, errors.New("unreachable")
	})
	dying := b.engine(t, fastConfig(crashing, f.child))
	dying.SetClient(insertOnlyClient(t, b)) // inserts the children's jobs; works none
	in := parentIn{Children: []childIn{{Name: "p", Await: true}, {Name: "q", Await: true}}}
	_, err := crashing.Run(ctx, dying, key, in, nil)
	require.Error(t, err)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_runs WHERE parent_id IS NOT NULL`), "both children were started")

	// The surviving process: the parent's real code, which starts them, calls, then waits.
	survivor := workflow.Define("parent", func(ctx context.Context, in parentIn) ([]string, error) {
		var runs []*workflow.ChildRun[string]
		for _, c := range in.Children {
			run, err := steps.StartChild(ctx, "start "+c.Name, f.child, c, nil)
			if err != nil {
				return nil, err
			}
			runs = append(runs, run)
		}
		if _, err := steps.Call(ctx, "between", func(context.Context, string) (int, error) { return 0, nil }, nil); err != nil {
			return nil, err
		}
		var outs []string
		for i, r := range runs {
			out, err := r.Wait(ctx, fmt.Sprintf("wait %d", i))
			if err != nil {
				return nil, err
			}
			outs = append(outs, out)
		}
		return outs, nil
	})
	e := b.engine(t, fastConfig(survivor, f.child))
	b.startRiver(t, e)
	eventually(t, 20*time.Second, "the parent to be resumed and wait", func() bool {
		s, _ := b.state(t, key)
		return s == "awaiting"
	})
	for _, name := range []string{"start p", "start q"} {
		f.signal(t, e, childKey(t, e, key, name))
	}
	require.Equal(t, "done", b.waitFinished(t, key))
	out, err := survivor.Run(b.ctx, e, key, in, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"p done", "q done"}, out)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_runs WHERE parent_id IS NOT NULL`), "no child was started twice")
	require.Equal(t, 1, f.childRuns(t, "p"))
	require.Equal(t, 1, f.childRuns(t, "q"))
}

// childrenPoint makes the crash helper a process that runs a parent which starts two children,
// and is killed with SIGKILL in the step after their starts.
const childrenPoint = "children"

var childrenKey = idem.Key{Scope: "merchant:7", ID: "killed-parent"}

// newKilledParent is the parent of TestChildrenSurviveSIGKILL: it starts two children that await
// a signal, calls (where the helper process dies), then waits for both.
func newKilledParent(f *family, inHelper bool) *workflow.Workflow[parentIn, []string] {
	return workflow.Define("parent", func(ctx context.Context, in parentIn) ([]string, error) {
		var runs []*workflow.ChildRun[string]
		for _, c := range in.Children {
			run, err := steps.StartChild(ctx, "start "+c.Name, f.child, c, nil)
			if err != nil {
				return nil, err
			}
			runs = append(runs, run)
		}
		if _, err := steps.Call(ctx, "between", func(context.Context, string) (int, error) {
			if inHelper {
				fmt.Println(crashMarker)
				select {} // wait here for SIGKILL
			}
			return 0, nil
		}, nil); err != nil {
			return nil, err
		}
		var outs []string
		for i, r := range runs {
			out, err := r.Wait(ctx, fmt.Sprintf("wait %d", i))
			if err != nil {
				return nil, err
			}
			outs = append(outs, out)
		}
		return outs, nil
	})
}

var killedParentIn = parentIn{Children: []childIn{{Name: "p", Await: true}, {Name: "q", Await: true}}}

func runChildrenHelper() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(helperDBEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	f := &family{}
	f.child = workflow.Define("child", func(ctx context.Context, in childIn) (string, error) { return "", errors.New("not here") })
	wf := newKilledParent(f, true)
	e, err := workflow.NewEngine(pool, fastConfig(wf, f.child))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// A client that inserts the children's jobs; this process works none of them.
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	e.SetClient(client)
	_, err = wf.Run(ctx, e, childrenKey, killedParentIn, nil)
	fmt.Fprintf(os.Stderr, "the parent ended without reaching its crash point: %v\n", err)
	return 3
}

// TestChildrenSurviveSIGKILL kills the process that runs a parent, with SIGKILL, after the parent
// started its children: the parent is resumed elsewhere, replays the starts (starting nothing),
// and collects its children's outcomes.
func TestChildrenSurviveSIGKILL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newFamily(b)
	killChildAt(t, b, childrenPoint)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_runs WHERE parent_id IS NOT NULL`), "both children were started before the kill")

	wf := newKilledParent(f, false)
	e := b.engine(t, fastConfig(wf, f.child))
	b.startRiver(t, e)
	eventually(t, 20*time.Second, "the parent to be resumed and wait for its children", func() bool {
		s, _ := b.state(t, childrenKey)
		return s == "awaiting"
	})
	for _, name := range []string{"start p", "start q"} {
		f.signal(t, e, childKey(t, e, childrenKey, name))
	}
	require.Equal(t, "done", b.waitFinished(t, childrenKey))
	out, err := wf.Run(b.ctx, e, childrenKey, killedParentIn, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"p done", "q done"}, out)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idem_runs WHERE parent_id IS NOT NULL`), "no child was started twice")
	require.Equal(t, 1, f.childRuns(t, "p"))
	require.Equal(t, 1, f.childRuns(t, "q"))
}
