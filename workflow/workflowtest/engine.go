package workflowtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/wfseam"
	"github.com/idemkit/idem/workflow"
)

// Config configures a test [Engine]. A nil *Config is an engine with no workflows.
//
//	te := workflowtest.New(t, &workflowtest.Config{
//		Workflows: []workflow.Definition{Payout},
//		Fakes:     map[string]workflowtest.Fake{"charge": chargeOK},
//	})
type Config struct {
	// Workflows are the workflows the engine runs, as workflow.Config.Workflows.
	Workflows []workflow.Definition

	// Engine holds the rest of the engine's settings (Lease, TTL, Schema, Version, Logger,
	// ...), as for workflow.NewEngine; nil for the defaults, with the engine's log going to the
	// test's output. Its Workflows are ignored: set them above.
	Engine *workflow.Config

	// Fakes replace the functions of Call steps (steps.Call, steps.GoCall, and any step built on
	// workflow.RunStep or GoStep) by step name: the fake runs instead, with the step's derived key, and its
	// result is the step's output, checkpointed and replayed as the real one would be.
	Fakes map[string]Fake

	// DB is the database the engine runs on, migrated (idem.Migrate, with Engine.Schema). Default:
	// a fresh database of the test's own (idemtest.NewPool), dropped when the test ends. Test
	// engines on one database share its virtual clock and their jobs: a test plays a deploy by
	// making an engine with the new code on the database of the old one.
	DB workflow.DB

	// River, when set, is the River client that steps.Enqueue inserts its jobs with (an
	// insert-only client is enough, on a database with River's tables: idemtest.Opts.River). The
	// engine's own jobs (wake-ups, resumes) never go to River: the test engine runs them.
	River *river.Client[pgx.Tx]
}

// Fake is the function a test engine runs instead of a Call step's: it gets the step's derived
// key, and returns the step's output (encoded as JSON, as a Call step's is, and decoded by the
// step into its type) or an error, which the step retries, or fails with, as it would the real
// function's (steps.Permanent fails it at once).
//
//	chargeOK := func(ctx context.Context, key string) (any, error) {
//		return Charge{ID: "ch_" + key[:8]}, nil
//	}
type Fake func(ctx context.Context, key string) (any, error)

// Engine is a workflow engine for tests: the same engine code as production's, on a real
// Postgres, with a virtual clock that the test moves, and without River. Sleeps, await timeouts,
// deadlines and the ticks of schedules (workflow.Workflow.Schedule) fire when the clock reaches
// them ([Engine.Advance]); the jobs that River would
// work (wake-ups, the runs of StartTx, RunResume and RunFork) run within the call that makes them
// due, so that when it returns, every run has gone as far as it can.
//
//	te := workflowtest.New(t, &workflowtest.Config{Workflows: []workflow.Definition{Reminder}})
//	_, err := Reminder.Run(ctx, te.Engine(), key, in, nil) // runs until its 30-day sleep: idem.ErrInFlight
//	require.ErrorIs(t, err, idem.ErrInFlight)
//	require.NoError(t, te.Advance(ctx, 30*24*time.Hour))   // wakes it, and it runs to its end
//	out, err := Reminder.Get(ctx, te.Engine(), key)
type Engine struct {
	engine *workflow.Engine
	db     workflow.DB
	st     *store.Statements

	mu  sync.Mutex   // one move of the clock at a time
	now atomic.Int64 // the virtual clock's time, µs since the epoch
}

// New returns a test engine, and closes it when the test ends. A database without idem's tables,
// or any other failure to set the engine up, fails the test.
//
//	te := workflowtest.New(t, &workflowtest.Config{Workflows: []workflow.Definition{Payout}})
func New(tb testing.TB, cfg *Config) *Engine {
	tb.Helper()
	te, err := newEngine(tb, cfg)
	if err != nil {
		tb.Fatalf("workflowtest: %v", err)
	}
	return te
}

func newEngine(tb testing.TB, cfg *Config) (*Engine, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	var ecfg workflow.Config
	if cfg.Engine != nil {
		ecfg = *cfg.Engine
	}
	ecfg.Workflows = cfg.Workflows
	if ecfg.Logger == nil {
		ecfg.Logger = slog.New(slog.NewTextHandler(tb.Output(), nil))
	}
	db := cfg.DB
	if db == nil {
		db = idemtest.NewPool(tb, &idemtest.Opts{Schema: ecfg.Schema})
	}
	e, err := workflow.NewEngine(db, &ecfg)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = e.Close() })
	te := &Engine{engine: e, db: db, st: store.ForVirtualClock(ecfg.Schema)}
	ctx := context.Background()
	if err := te.st.VirtualClockCreate(ctx, db); err != nil {
		return nil, fmt.Errorf("error creating the virtual clock: %w", err)
	}
	// A second test engine on the database (a deploy, in a test) reads the clock where the
	// first one left it.
	now, err := te.st.ClockNow(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("error reading the virtual clock: %w", err)
	}
	te.now.Store(now.UnixMicro())
	if err := te.st.TestJobsCreate(ctx, db); err != nil {
		return nil, fmt.Errorf("error creating the table of the engine's jobs: %w", err)
	}
	calls := make(map[string]func(ctx context.Context, key string) ([]byte, error), len(cfg.Fakes))
	for name, fake := range cfg.Fakes {
		if fake == nil {
			return nil, fmt.Errorf("the fake of step %q in Config.Fakes is nil; give it a function, or leave the step out", name)
		}
		calls[name] = func(ctx context.Context, key string) ([]byte, error) {
			out, err := fake(ctx, key)
			if err != nil {
				return nil, err
			}
			data, err := json.Marshal(out)
			if err != nil {
				return nil, fmt.Errorf("workflowtest: error encoding the output of the fake of step %q (%T) as JSON: %w", name, out, err)
			}
			return data, nil
		}
	}
	err = wfseam.Install(e, wfseam.Options{VirtualClock: true, Now: te.Now, Jobs: jobSink{te}, Calls: calls, NoBackoff: true})
	if err != nil {
		return nil, err
	}
	if cfg.River != nil {
		e.SetClient(cfg.River) // no workers are added, so the engine does not scan
	}
	return te, nil
}

// Engine returns the workflow engine, for everything a test does with a production one: Run,
// Get, StartTx, SignalTx, RunGet, RunCancel, RunResume, RunFork.
//
//	out, err := Payout.Run(ctx, te.Engine(), key, req, nil)
func (te *Engine) Engine() *workflow.Engine { return te.engine }

// DB returns the engine's database.
//
//	var n int
//	err := te.DB().QueryRow(ctx, `SELECT count(*) FROM payouts`).Scan(&n)
func (te *Engine) DB() workflow.DB { return te.db }

// Now returns the virtual clock's time. It starts at the real time when the first test engine on
// the database is made, and then stands still, to the microsecond, until the test moves it.
//
//	deadline := te.Now().Add(24 * time.Hour)
func (te *Engine) Now() time.Time { return time.UnixMicro(te.now.Load()) }

// ErrClockBackwards is returned by Advance and AdvanceTo for a move into the past: runs have
// been woken, and deadlines passed, by the time the clock shows.
//
//	err := te.Advance(ctx, -time.Hour) // errors.Is(err, workflowtest.ErrClockBackwards)
var ErrClockBackwards = errors.New("workflowtest: the virtual clock only moves forward")

// Advance moves the virtual clock d forward, through every wake-up, await timeout, deadline and
// schedule tick that falls due on the way, in the order they fall due: the clock stops at each,
// and the run it wakes or starts goes on (until its end or its next wait) before the clock moves
// on. A schedule fires as the production scheduler fires it (its overlap and catch-up policies,
// its time zone), with the virtual clock's time. A negative d is
// refused with ErrClockBackwards.
//
//	require.NoError(t, te.Advance(ctx, 7*24*time.Hour)) // the await's timeout fires
func (te *Engine) Advance(ctx context.Context, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w: Advance(%s) would move it back; move it forward, or start from a new engine", ErrClockBackwards, d)
	}
	te.mu.Lock()
	defer te.mu.Unlock()
	return te.advanceTo(ctx, te.Now().Add(d))
}

// AdvanceTo moves the virtual clock to t, as Advance does. A t before the clock's time is
// refused with ErrClockBackwards.
//
//	require.NoError(t, te.AdvanceTo(ctx, req.SettlesAt))
func (te *Engine) AdvanceTo(ctx context.Context, t time.Time) error {
	te.mu.Lock()
	defer te.mu.Unlock()
	if now := te.Now(); t.Before(now) {
		return fmt.Errorf("%w: AdvanceTo(%s) is %s before the clock's time (%s)", ErrClockBackwards, t.Format(time.RFC3339Nano), now.Sub(t), now.Format(time.RFC3339Nano))
	}
	return te.advanceTo(ctx, t)
}

// advanceTo moves the clock to t through the jobs and schedule ticks due on the way, the
// earliest first; the caller holds te.mu.
func (te *Engine) advanceTo(ctx context.Context, t time.Time) error {
	for idle := 0; ; {
		// A schedule tick due before the next job is fired first: the clock stops at the tick,
		// and the run it starts is a job due then.
		until, tick := t, false
		if next, ok, err := te.nextTick(ctx); err != nil {
			return err
		} else if ok && !next.After(t) {
			until, tick = next, true
		}
		job, ok, err := te.st.TestJobTake(ctx, te.db, until)
		if err != nil {
			return fmt.Errorf("workflowtest: error reading the engine's jobs: %w", err)
		}
		switch {
		case ok:
			if err := te.setClock(ctx, job.RunAt); err != nil {
				return err
			}
			if err := te.work(ctx, job); err != nil {
				return err
			}
		case tick:
			if err := te.setClock(ctx, until); err != nil {
				return err
			}
			fired, err := wfseam.FireSchedules(ctx, te.engine)
			if err != nil {
				return fmt.Errorf("workflowtest: %w", err)
			}
			// A schedule that stays due without firing (another engine on the database holds it)
			// would keep the clock here for ever.
			if idle = idle + 1; fired > 0 {
				idle = 0
			} else if idle == 3 {
				return fmt.Errorf("workflowtest: a schedule due at %s does not fire: is another engine firing this database's schedules?", until.Format(time.RFC3339Nano))
			}
		default:
			return te.setClock(ctx, t)
		}
	}
}

// nextTick says when the earliest active schedule's next tick is due, by the virtual clock.
func (te *Engine) nextTick(ctx context.Context) (time.Time, bool, error) {
	d, ok, err := te.st.ScheduleNextDue(ctx, te.db, nil)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("workflowtest: error reading the schedules: %w", err)
	}
	return te.Now().Add(d), ok, nil
}

// RunDue runs the jobs that are due without moving the clock: the run a StartTx, RunResume or
// RunFork started, a wake-up a signal sent with Engine().SignalTx made. Advance and Signal run
// them too.
//
//	require.NoError(t, Payout.StartTx(ctx, te.Engine(), tx, key, req)) // in a transaction that commits
//	require.NoError(t, te.RunDue(ctx))                                  // the run runs now
func (te *Engine) RunDue(ctx context.Context) error { return te.Advance(ctx, 0) }

// Signal sends a signal to the run under key, as Engine().SignalTx does in a transaction of its
// own, and runs the wake-up it makes due: when Signal returns, an awaiting run has gone on.
//
//	_, err := te.Signal(ctx, key, "charge.confirmed", Confirmation{ChargeID: "ch_1"}, nil)
func (te *Engine) Signal(ctx context.Context, key idem.Key, name string, payload any, opts *workflow.SignalOpts) (*workflow.SignalResult, error) {
	var res *workflow.SignalResult
	err := pgx.BeginFunc(ctx, te.db, func(t pgx.Tx) error {
		var err error
		res, err = te.engine.SignalTx(ctx, t, key, name, payload, opts)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, te.RunDue(ctx)
}

// History returns the run's completed steps, in order (RunGet's Steps).
//
//	steps, err := te.History(ctx, key)
//	require.Equal(t, "charge", steps[1].Name)
func (te *Engine) History(ctx context.Context, key idem.Key) ([]workflow.StepRow, error) {
	run, err := te.engine.RunGet(ctx, key)
	if err != nil {
		return nil, err
	}
	return run.Steps, nil
}

// setClock moves the virtual clock to t, if t is ahead of it: the statements' clock first, then
// the process's, so that neither reads a time the other has not reached.
func (te *Engine) setClock(ctx context.Context, t time.Time) error {
	if t.UnixMicro() <= te.now.Load() {
		return nil
	}
	if err := te.st.VirtualClockSet(ctx, te.db, t); err != nil {
		return fmt.Errorf("workflowtest: error moving the virtual clock: %w", err)
	}
	te.now.Store(t.UnixMicro())
	return nil
}

// work runs a job through the engine's own worker.
func (te *Engine) work(ctx context.Context, job store.TestJob) error {
	err := wfseam.Work(ctx, te.engine, job.Kind, job.Args)
	if _, snoozed := wfseam.Snoozed(err); snoozed {
		return fmt.Errorf("workflowtest: a %s job (%s) could not run its run here: its workflow is not in Config.Workflows, or its version is not in Engine.ResumeVersions", job.Kind, job.Args)
	}
	if err != nil {
		return fmt.Errorf("workflowtest: a %s job (%s) failed: %w", job.Kind, job.Args, err)
	}
	return nil
}

// jobSink keeps the engine's jobs in the test's database, in the transaction that makes them.
type jobSink struct{ te *Engine }

func (s jobSink) InsertTx(ctx context.Context, t pgx.Tx, kind string, args []byte, at time.Time) error {
	return s.te.st.TestJobInsert(ctx, t, kind, args, at)
}
