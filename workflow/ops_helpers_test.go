package workflow_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

type pgxTx = pgx.Tx

// blocking are hooks that stop the first run to reach point until released.
type blocking struct {
	*hooks
	reached chan struct{}
}

func blockAt(point string) (*blocking, func()) {
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := &hooks{at: func(_ context.Context, p string) {
		if p != point {
			return
		}
		first := false
		once.Do(func() { first = true })
		if first {
			close(reached)
			<-release
		}
	}}
	var releaseOnce sync.Once
	return &blocking{hooks: h, reached: reached}, func() { releaseOnce.Do(func() { close(release) }) }
}

// flaky is a workflow of three Tx steps, a, b and c, each writing an effect; b fails while
// broken is set. runs counts each step's executions (attempts included).
type flaky struct {
	wf     *workflow.Workflow[int, int]
	broken atomic.Bool
	runs   map[string]*atomic.Int32
}

func newFlaky(b *testBundle) *flaky {
	f := &flaky{runs: map[string]*atomic.Int32{"a": {}, "b": {}, "c": {}}}
	step := func(ctx context.Context, name string) (int, error) {
		return steps.Tx(ctx, name, func(ctx context.Context, tx pgx.Tx) (int, error) {
			f.runs[name].Add(1)
			if name == "b" && f.broken.Load() {
				return 0, errors.New("b is broken")
			}
			var id int
			err := tx.QueryRow(ctx, `INSERT INTO effects (run, step) VALUES ('flaky', $1) RETURNING id`, name).Scan(&id)
			return id, err
		}, &steps.Opts{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	}
	f.wf = workflow.Define("abc", func(ctx context.Context, in int) (int, error) {
		sum := in
		for _, name := range []string{"a", "b", "c"} {
			n, err := step(ctx, name)
			if err != nil {
				return 0, err
			}
			sum += n
		}
		return sum, nil
	})
	return f
}

// effects counts the committed effects of a step.
func (b *testBundle) effects(t testing.TB, step string) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM effects WHERE step = $1`, step)
}

// insertOnlyClient is a River client with no workers, as cmd/idem makes: it inserts jobs for
// the application's client to work.
func insertOnlyClient(t testing.TB, b *testBundle) *river.Client[pgx.Tx] {
	t.Helper()
	c, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Logger: quietLogger()})
	require.NoError(t, err)
	return c
}
