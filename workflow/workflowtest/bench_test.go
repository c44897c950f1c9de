package workflowtest_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/workflow"
)

// BenchmarkLongWaits tests the workflow of a 30-day sleep, an await with a 7-day timeout and a
// 60-day deadline to its end, on the test engine's virtual clock: the wall time per op is what
// such a test costs. "run" reuses one engine (and database) for every op; "test" makes a new
// engine on a fresh database for each, as a test of its own would (idemtest: CREATE DATABASE and
// the migrations count).
//
//	go test -run '^$' -bench LongWaits -count 3 ./workflow/workflowtest/
func BenchmarkLongWaits(b *testing.B) {
	oneRun := func(b *testing.B, bundle *testBundle, i int) {
		key := idem.Key{Scope: "bench", ID: fmt.Sprint(i)}
		_, err := longWaits.Run(bundle.ctx, bundle.te.Engine(), key, i, &workflow.RunOpts{Timeout: 60 * day})
		require.ErrorIs(b, err, idem.ErrInFlight)
		require.NoError(b, bundle.te.Advance(bundle.ctx, 30*day))
		require.NoError(b, bundle.te.Advance(bundle.ctx, 7*day))
		out, err := longWaits.Get(bundle.ctx, bundle.te.Engine(), key)
		require.NoError(b, err)
		require.NotEmpty(b, out.Released, "the await timed out and the charge was released")
	}
	b.Run("run", func(b *testing.B) {
		bundle := setup(b)
		b.ResetTimer()
		for i := range b.N {
			oneRun(b, bundle, i)
		}
	})
	b.Run("test", func(b *testing.B) {
		for i := range b.N {
			tb := &iterationTB{TB: b}
			oneRun(b, setup(tb), i)
			tb.cleanup()
		}
	})
}

// iterationTB is the testing.TB of one iteration of a benchmark: its cleanups (the engine's, the
// database's) run when the iteration ends, as a test's do when it ends.
type iterationTB struct {
	testing.TB
	cleanups []func()
}

func (t *iterationTB) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }

func (t *iterationTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
