package workflow_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
	"github.com/idemkit/idem/workflow/workflowtest"
)

// bulk is a JSON string of n bytes once encoded, whose letters depend on seed.
func bulk(n int, seed byte) string { return strings.Repeat(string(rune('a'+seed%26)), n-2) }

// bulky are the large payloads of newBulky's run: a Call's output of 4 KiB, a Tx's of 64 KiB, an
// event's value and a signal's payload.
type bulky struct {
	Four, SixtyFour, Event, Signal string
}

func wantBulky() bulky {
	return bulky{Four: bulk(4<<10, 1), SixtyFour: bulk(64<<10, 2), Event: bulk(3<<10, 3), Signal: bulk(8<<10, 4)}
}

// newBulky runs a Call with a 4 KiB output and a Tx with a 64 KiB one (each recording each time
// it runs), publishes a large event, awaits a large signal, and returns what it got from each.
// It calls crash once the Tx step has committed (its transaction commits when the event
// step's begins), and seen (when not nil) with what it returns.
func newBulky(db workflow.DB, crash func(), seen func(bulky)) *workflow.Workflow[int, bulky] {
	w := wantBulky()
	return workflow.Define("bulky", func(ctx context.Context, _ int) (bulky, error) {
		four, err := steps.Call(ctx, "four", func(ctx context.Context, _ string) (string, error) {
			_, err := db.Exec(context.WithoutCancel(ctx), `INSERT INTO calls (run, step, key) VALUES ('bulky', 'four', '')`)
			return w.Four, err
		}, nil)
		if err != nil {
			return bulky{}, err
		}
		sixtyFour, err := steps.Tx(ctx, "sixty-four", func(ctx context.Context, tx pgx.Tx) (string, error) {
			return w.SixtyFour, effect(ctx, tx, "bulky", "sixty-four", "")
		}, nil)
		if err != nil {
			return bulky{}, err
		}
		if err := steps.SetEvent(ctx, "ev", w.Event); err != nil {
			return bulky{}, err
		}
		// The event step's transaction is open here, and sixty-four's committed.
		crash()
		sig, err := steps.Await[string](ctx, "await", "sig", 0)
		if err != nil {
			return bulky{}, err
		}
		out := bulky{Four: four, SixtyFour: sixtyFour, Event: w.Event, Signal: sig}
		if seen != nil {
			seen(out)
		}
		return out, nil
	})
}

// TestLargeRunPayloads runs a workflow whose step outputs, signal and event are over
// store.PayloadInlineMax, stops its process after two steps, and resumes it elsewhere: the
// resumed run must replay the outputs byte for byte without running the completed steps again,
// and the operator's reads must show them. With the start day's partition there, the payloads
// live in it; without it, inline.
func TestLargeRunPayloads(t *testing.T) {
	t.Parallel()
	for _, partition := range []bool{true, false} {
		name := "InPartition"
		if !partition {
			name = "InlineWithoutPartition"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var today time.Time
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today))
			part := store.PartitionName("idem_run_payloads", today)
			if !partition {
				_, err := b.pool.Exec(b.ctx, `DROP TABLE `+part)
				require.NoError(t, err)
			}
			key := idem.Key{Scope: "merchant:7", ID: "bulky"}
			ctx, cancel := context.WithCancel(b.ctx)
			var once sync.Once
			wf := newBulky(b.pool, func() { once.Do(cancel) }, nil)
			e := b.engine(t, fastConfig(wf))
			_, err := wf.Run(ctx, e, key, 0, nil)
			require.ErrorIs(t, err, context.Canceled)
			state, _ := b.state(t, key)
			require.Equal(t, "running", state, "stopped holding its lease, after two steps")

			// Where the outputs are, as the first process left them.
			var inParts, inline int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE output IS NULL AND output_day IS NOT NULL),
	count(*) FILTER (WHERE output IS NOT NULL AND output_day IS NULL) FROM idem_steps`).Scan(&inParts, &inline))
			if partition {
				require.Equal(t, 2, inParts)
				require.Equal(t, 2, b.count(t, `SELECT count(*) FROM `+part+` WHERE kind = 's'`))
			} else {
				require.Equal(t, 2, inline)
				require.Zero(t, b.count(t, `SELECT count(*) FROM idem_run_payloads`))
			}

			// Another process resumes it, up to the await.
			wf2 := newBulky(b.pool, func() {}, nil)
			e2 := b.engine(t, fastConfig(wf2))
			if partition {
				b.startRiver(t, e2)
			} else {
				b.startRiverWithoutReaper(t, e2) // the reaper would make today's partition
			}
			eventually(t, 20*time.Second, "the run to await its signal", func() bool {
				state, _ := b.state(t, key)
				return state == "awaiting"
			})
			w := wantBulky()
			require.NoError(t, b.inTx(func(ctx context.Context, t pgx.Tx) error {
				_, err := e2.SignalTx(ctx, t, key, "sig", w.Signal, nil)
				return err
			}))
			require.Equal(t, "done", b.waitFinished(t, key))
			out, err := wf2.Run(b.ctx, e2, key, 0, nil)
			require.NoError(t, err)
			require.Equal(t, w, out, "byte for byte")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM calls WHERE step = 'four'`), "the completed Call was replayed, not run again")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'sixty-four'`), "the completed Tx was replayed")

			var large, payloads int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
	(SELECT count(*) FROM idem_steps WHERE output_day IS NOT NULL) + (SELECT count(*) FROM idem_signals WHERE payload_day IS NOT NULL)
	+ (SELECT count(*) FROM idem_events WHERE value_day IS NOT NULL), (SELECT count(*) FROM idem_run_payloads)`).Scan(&large, &payloads))
			if partition {
				// four, sixty-four, the event step and the await; the signal; the event.
				require.Equal(t, 6, large)
				require.Equal(t, 6, payloads)
			} else {
				require.Zero(t, large)
				require.Zero(t, payloads)
			}

			// What operators read: the run with its steps (RunGet, idem runs show and export),
			// its mailbox and events, and a replay of its export.
			run, err := e2.RunGet(b.ctx, key)
			require.NoError(t, err)
			require.Len(t, run.Steps, 4)
			for i, want := range []string{w.Four, w.SixtyFour, w.Event} {
				var got string
				require.NoError(t, json.Unmarshal(run.Steps[i].Output, &got), "step %d", i+1)
				require.Equal(t, want, got, "step %d", i+1)
			}
			var awaited struct {
				Payload string `json:"payload"`
			}
			require.NoError(t, json.Unmarshal(run.Steps[3].Output, &awaited))
			require.Equal(t, w.Signal, awaited.Payload, "the await's output holds the signal's payload")
			act, err := e2.RunActivity(b.ctx, key)
			require.NoError(t, err)
			require.Len(t, act.Signals, 1)
			require.JSONEq(t, jsonString(w.Signal), string(act.Signals[0].Payload))
			require.Len(t, act.Events, 1)
			require.JSONEq(t, jsonString(w.Event), string(act.Events[0].Value))
			ev, err := workflow.GetEvent[string](b.ctx, e2, key, "ev", 0)
			require.NoError(t, err)
			require.Equal(t, w.Event, ev)

			var buf bytes.Buffer
			require.NoError(t, json.NewEncoder(&buf).Encode(workflowtest.Export{Runs: []*workflow.RunRow{run}}))
			runs, err := workflowtest.ReadExport(&buf)
			require.NoError(t, err)
			var replayed bulky
			require.NoError(t, workflowtest.Replay(b.ctx, newBulky(nil, func() {}, func(o bulky) { replayed = o }), runs[0]))
			require.Equal(t, w, replayed, "the export replays byte for byte")

			// A fork from the await copies the three steps before it, large outputs and event
			// included, into its own rows or its start day's partition, and replays them.
			forked := idem.Key{Scope: "merchant:7", ID: "bulky-fork"}
			require.NoError(t, e2.RunFork(b.ctx, key, forked, 4))
			var forkLarge int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
	(SELECT count(*) FROM idem_steps WHERE id = 'bulky-fork' AND output_day IS NOT NULL)
	+ (SELECT count(*) FROM idem_events WHERE id = 'bulky-fork' AND value_day IS NOT NULL)`).Scan(&forkLarge))
			if partition {
				require.Equal(t, 4, forkLarge, "three steps and the event")
			} else {
				require.Zero(t, forkLarge)
			}
			eventually(t, 20*time.Second, "the fork to await its signal", func() bool {
				state, _ := b.state(t, forked)
				return state == "awaiting"
			})
			require.NoError(t, b.inTx(func(ctx context.Context, t pgx.Tx) error {
				_, err := e2.SignalTx(ctx, t, forked, "sig", w.Signal, nil)
				return err
			}))
			require.Equal(t, "done", b.waitFinished(t, forked))
			out, err = wf2.Run(b.ctx, e2, forked, 0, nil)
			require.NoError(t, err)
			require.Equal(t, w, out, "the fork replays the copied outputs byte for byte")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM calls WHERE step = 'four'`), "the fork replayed the Call")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'sixty-four'`), "and the Tx")
			ev, err = workflow.GetEvent[string](b.ctx, e2, forked, "ev", 0)
			require.NoError(t, err)
			require.Equal(t, w.Event, ev)

			// A large output gone from its partition (dropped by hand) is never copied as an
			// empty one: the fork is refused, and nothing of it is left.
			if partition {
				_, err = b.pool.Exec(b.ctx, `DELETE FROM idem_run_payloads WHERE id = 'bulky' AND kind = 's' AND ref = '1'`)
				require.NoError(t, err)
				err = e2.RunFork(b.ctx, key, idem.Key{Scope: "merchant:7", ID: "bulky-fork-2"}, 3)
				require.ErrorIs(t, err, store.ErrPayloadMissing)
				require.ErrorContains(t, err, "the outputs of 1 step before step 3")
				require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys WHERE id = 'bulky-fork-2'`))
				require.NoError(t, e2.RunFork(b.ctx, key, idem.Key{Scope: "merchant:7", ID: "bulky-fork-3"}, 1), "a fork that copies no step is fine")
			}
		})
	}
}

// startRiverWithoutReaper is startRiver with the recovery scan as the only periodic job.
func (b *testBundle) startRiverWithoutReaper(t testing.TB, e *workflow.Engine) {
	t.Helper()
	b.startRiverPeriodic(t, e, e.PeriodicJobs()[:1]) // the scan; the reaper is second
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestResentStartKeepsTheGeneration: a first Tx step that fails once shares the run's start
// transaction, which is rolled back with it and sent again, inserting the run anew with a later
// created_at. The engine goes on with that generation: its large outputs go by the new start
// day, and a sleep's wake-up job names the run as it is stored, so that it wakes it.
func TestResentStartKeepsTheGeneration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out := bulk(4<<10, 5)
	var attempts int
	wf := workflow.Define("resent", func(ctx context.Context, _ int) (string, error) {
		got, err := steps.Tx(ctx, "first", func(ctx context.Context, tx pgx.Tx) (string, error) {
			attempts++
			if attempts == 1 {
				return "", errBoom
			}
			return out, effect(ctx, tx, "resent", "first", "")
		}, nil)
		if err != nil {
			return "", err
		}
		if err := steps.Sleep(ctx, "nap", time.Hour); err != nil {
			return "", err
		}
		return got[:1], nil
	})
	e := b.engine(t, fastConfig(wf))
	e.SetClient(insertOnlyClient(t, b))
	key := idem.Key{Scope: "s", ID: "resent"}
	_, err := wf.Run(b.ctx, e, key, 0, nil)
	require.ErrorIs(t, err, idem.ErrInFlight, "asleep")
	require.Equal(t, 2, attempts)

	var created, generation int64
	var sameDay bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (extract(epoch FROM r.created_at) * 1000000)::int8, (j.args->>'generation')::int8,
	s.output_day IS NOT DISTINCT FROM CASE WHEN s.output IS NULL THEN (r.created_at AT TIME ZONE 'UTC')::date END
FROM idem_runs r JOIN idem_steps s USING (scope, id) JOIN river_job j ON j.kind = 'idem_workflow_wake'
WHERE r.scope = $1 AND r.id = $2 AND s.seq = 1`, key.Scope, key.ID).Scan(&created, &generation, &sameDay))
	require.Equal(t, created, generation, "the wake-up job names the run as stored")
	require.True(t, sameDay, "the output went by the stored run's start day")
}
