package idem

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The pacer is arithmetic on the batches' measured times; these tests feed it times, and
// TestReap checks what Reap does with it against Postgres.
func TestReapPacer(t *testing.T) {
	t.Parallel()
	const batchTime = 25 * time.Millisecond
	perRow := func(d time.Duration, n int) time.Duration { return d * time.Duration(n) }

	t.Run("RestsForItsShareAtTheBestSpeed", func(t *testing.T) {
		t.Parallel()
		p := pacer{busy: 0.25, batchTime: batchTime}
		p.start(500)
		for range 5 {
			rest, pressure := p.done(500, 500, perRow(50*time.Microsecond, 500))
			require.InDelta(t, 1, pressure, 1e-9)
			require.Equal(t, 75*time.Millisecond, rest, "a quarter of the time: 25 ms of work, 75 ms of rest")
		}
	})

	t.Run("BacksOffWhenItsBatchesSlowDownAndComesBack", func(t *testing.T) {
		t.Parallel()
		p := pacer{busy: 0.25, batchTime: batchTime}
		p.start(500)
		p.done(500, 500, perRow(10*time.Microsecond, 500))

		// One slow batch is a checkpoint or a cold page, not a surge: a little more rest.
		took := perRow(15*time.Microsecond, 500)
		rest, pressure := p.done(500, 500, took)
		require.Greater(t, pressure, 1.0)
		require.Less(t, pressure, 1.2)
		require.InDelta(t, float64(took)*3*pressure, float64(rest), 1)

		// Batches that stay slower than the best: the traffic has the server; the reaper rests
		// longer per unit of work, up to twice, however slow they get, so the backlog drains.
		for range 20 {
			rest, pressure = p.done(500, 500, took)
		}
		require.InDelta(t, 1.45, pressure, 0.05, "the best drifts up 0.2 %% a batch")
		for range 20 {
			rest, pressure = p.done(500, 500, perRow(time.Millisecond, 500))
		}
		require.Equal(t, maxReapPressure, pressure)
		require.Equal(t, time.Duration(float64(perRow(time.Millisecond, 500))*3*maxReapPressure), rest)

		// The traffic eases: back to its share.
		for range 20 {
			_, pressure = p.done(500, 500, perRow(10*time.Microsecond, 500))
		}
		require.InDelta(t, 1, pressure, 1e-3)
	})

	t.Run("ALastingChangeInCostIsLearnt", func(t *testing.T) {
		t.Parallel()
		p := pacer{busy: 0.25, batchTime: batchTime}
		p.start(500)
		p.done(500, 500, perRow(10*time.Microsecond, 500))
		var pressure float64
		for range 600 {
			_, pressure = p.done(500, 500, perRow(20*time.Microsecond, 500))
		}
		require.InDelta(t, 1, pressure, 1e-3, "a cost that stays is the new best")
	})

	t.Run("BusyOneNeverRests", func(t *testing.T) {
		t.Parallel()
		p := pacer{busy: 1, batchTime: batchTime}
		p.start(500)
		p.done(500, 500, perRow(10*time.Microsecond, 500))
		rest, _ := p.done(500, 500, perRow(40*time.Microsecond, 500))
		require.Zero(t, rest)
	})

	t.Run("SizesBatchesToTheBatchTime", func(t *testing.T) {
		t.Parallel()
		p := pacer{busy: 0.25, batchTime: batchTime}
		p.start(500)
		for range 30 {
			p.done(p.batch, p.batch, perRow(10*time.Microsecond, p.batch))
		}
		require.InDelta(t, 2500, p.batch, 10, "25 ms at 10 µs a row")

		p.start(100) // another kind of row starts afresh
		require.Equal(t, 100, p.batch)
		require.Zero(t, p.best)
		for range 30 {
			p.done(p.batch, p.batch, perRow(time.Second, p.batch))
		}
		require.Equal(t, minReapBatch, p.batch)
	})
}
