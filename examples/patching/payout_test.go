package patching_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/patching"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/workflow"
	"github.com/idemkit/idem/workflow/workflowtest"
)

func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }

// noProvider stands for the payment provider, whose calls the tests replace with fakes: it is
// never reached.
type noProvider struct{}

func (noProvider) Check(context.Context, string, patching.Request) (bool, error) {
	return false, errors.New("the provider is not called in tests")
}

func (noProvider) Charge(context.Context, string, patching.Request) (string, error) {
	return "", errors.New("the provider is not called in tests")
}

var unfinished = []workflow.RunState{workflow.RunStateQueued, workflow.RunStateRunning, workflow.RunStateSleeping, workflow.RunStateAwaiting}

// deployment is one deploy of the application: its engine, on the database every deploy shares,
// with its code and its version.
type deployment struct {
	te      *workflowtest.Engine
	payout  *workflow.Workflow[patching.Request, patching.Receipt]
	checks  *atomic.Int32 // fraud checks made, across deploys
	charges *atomic.Int32
}

func deploy(t *testing.T, db workflow.DB, version string, payout *workflow.Workflow[patching.Request, patching.Receipt], checks, charges *atomic.Int32) *deployment {
	te := workflowtest.New(t, &workflowtest.Config{
		Workflows: []workflow.Definition{payout},
		Engine:    &workflow.Config{Version: version},
		DB:        db,
		Fakes: map[string]workflowtest.Fake{
			"fraud-check": func(ctx context.Context, key string) (any, error) { checks.Add(1); return true, nil },
			"charge":      func(ctx context.Context, key string) (any, error) { charges.Add(1); return "ch_" + key[:8], nil },
		},
	})
	return &deployment{te: te, payout: payout, checks: checks, charges: charges}
}

// start starts a payout, which runs until its cool-off.
func (d *deployment) start(t *testing.T, id string) idem.Key {
	key := idem.Key{Scope: "merchant:7", ID: id}
	_, err := d.payout.Run(t.Context(), d.te.Engine(), key, patching.Request{Account: "acct-1", Amount: 100}, nil)
	require.ErrorIs(t, err, idem.ErrInFlight, "asleep in the cool-off")
	return key
}

func (d *deployment) receipt(t *testing.T, key idem.Key) patching.Receipt {
	r, err := d.payout.Get(t.Context(), d.te.Engine(), key)
	require.NoError(t, err)
	return r
}

// left lists the unfinished runs that the given versions started.
func (d *deployment) left(t *testing.T, versions ...string) []*workflow.RunRow {
	res, err := d.te.Engine().RunList(t.Context(), &workflow.RunListParams{Versions: versions, States: unfinished})
	require.NoError(t, err)
	return res.Runs
}

// check is the replay check before a deploy: the unfinished runs against the code to deploy.
func check(t *testing.T, d *deployment, code *workflow.Workflow[patching.Request, patching.Receipt]) *workflowtest.ReplayReport {
	runs, err := workflowtest.LoadRuns(t.Context(), d.te.Engine(), &workflow.RunListParams{States: unfinished})
	require.NoError(t, err)
	report, err := workflowtest.ReplayAll(t.Context(), []workflow.Definition{code}, runs)
	require.NoError(t, err)
	return report
}

// TestThreeDeploys walks the change of the package doc: a fraud check inserted before the
// cool-off, under runs that sleep in it, in three deploys, each checked by a replay first.
func TestThreeDeploys(t *testing.T) {
	t.Parallel()
	var checks, charges atomic.Int32
	psp := noProvider{}
	db := idemtest.NewPool(t, nil)

	// Before: a payout asleep in its three-day cool-off.
	v0 := deploy(t, db, "v0", patching.PayoutV1(psp), &checks, &charges)
	old := v0.start(t, "old")

	// The change made without a patch would break it; with one, it would not.
	report := check(t, v0, patching.PayoutUnpatched(psp))
	require.Len(t, report.Problems, 1)
	nd := report.Problems[0].Divergence()
	require.Equal(t, workflow.Divergence{Seq: 2, StoredKind: "sleep", StoredName: "cool-off", CalledKind: "call", CalledName: "fraud-check"}, nd.Divergence)
	require.Empty(t, check(t, v0, patching.PayoutPatched(psp)).Problems)

	// Deploy 1: the patch. The old run wakes on it and takes the old branch; a new one the new.
	v1 := deploy(t, db, "v1", patching.PayoutPatched(psp), &checks, &charges)
	fresh := v1.start(t, "new")
	require.NoError(t, v1.te.Advance(t.Context(), patching.CoolOff))
	require.False(t, v1.receipt(t, old).Checked)
	require.True(t, v1.receipt(t, fresh).Checked)
	require.EqualValues(t, 1, checks.Load())
	require.EqualValues(t, 2, charges.Load())
	mid := v1.start(t, "mid") // records the marker, then sleeps through deploy 2

	// Deploy 2, once no run of v0 is left: the patch deprecated.
	require.Empty(t, v1.left(t, "v0"))
	require.Empty(t, check(t, v1, patching.PayoutDeprecated(psp)).Problems)
	v2 := deploy(t, db, "v2", patching.PayoutDeprecated(psp), &checks, &charges)
	later := v2.start(t, "later") // records no marker
	require.NoError(t, v2.te.Advance(t.Context(), patching.CoolOff))
	require.True(t, v2.receipt(t, mid).Checked, "found its marker where it recorded it")
	require.True(t, v2.receipt(t, later).Checked)
	last := v2.start(t, "last")

	// Deploy 3, once no run of v1 (which may hold the marker) is left: the code as if it had
	// always been so.
	require.Empty(t, v2.left(t, "v0", "v1"))
	require.Empty(t, check(t, v2, patching.PayoutFinal(psp)).Problems)
	v3 := deploy(t, db, "v3", patching.PayoutFinal(psp), &checks, &charges)
	require.NoError(t, v3.te.Advance(t.Context(), patching.CoolOff))
	require.True(t, v3.receipt(t, last).Checked)
	require.EqualValues(t, 4, checks.Load(), "new, mid, later, last")
	require.EqualValues(t, 5, charges.Load(), "every payout charged once")
	history, err := v3.te.History(t.Context(), fresh)
	require.NoError(t, err)
	require.Equal(t, "patch", history[1].Kind, "the new run's marker")
}
