// Package wfseam is the seam between package workflow and the packages of idem that drive a
// workflow engine otherwise than production does: the test engine and the replayer (package
// workflowtest) and the operator's replay check (cmd/idem). Package workflow fills in the
// functions below when it is initialised; what they take and return as any are workflow's own
// types, named in each comment. Nothing here is part of idem's API.
package wfseam

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options change how an engine meets the world, and nothing of how it runs a workflow: the same
// code runs a test engine's runs as production's.
type Options struct {
	// VirtualClock makes the engine's statements read the virtual clock of
	// store.ForVirtualClock (whose table must exist), and its own checks of time (deadlines)
	// read Now, which must keep the same offset from the process's clock as that table from
	// Postgres's.
	VirtualClock bool
	Now          func() time.Time

	// Jobs, when set, receives the jobs the engine inserts for itself (wake-ups, resumes) instead
	// of River: kind is the job's river.JobArgs Kind, args its JSON, at when it is due (zero: at
	// once), in t, the transaction that would have inserted the River job.
	Jobs JobSink

	// Calls replace the bodies of the steps built on workflow.RunStep and GoStep (steps.Call,
	// steps.GoCall) by step name: the fake gets the step's derived key and returns the step's
	// output as JSON.
	Calls map[string]func(ctx context.Context, key string) ([]byte, error)

	// NoBackoff makes the retries of a failed step attempt follow at once.
	NoBackoff bool
}

// JobSink keeps the jobs of an engine with Options.Jobs.
type JobSink interface {
	InsertTx(ctx context.Context, t pgx.Tx, kind string, args []byte, at time.Time) error
}

var (
	// Install gives engine (a *workflow.Engine, before any use) options.
	Install func(engine any, o Options) error

	// Work runs a job that engine (a *workflow.Engine) gave its JobSink, as the engine's River
	// worker of that kind would. A job that River would snooze comes back as an error for which
	// Snoozed reports true.
	Work func(ctx context.Context, engine any, kind string, args []byte) error

	// FireSchedules fires the due schedules of engine (a *workflow.Engine), as one pass of its
	// scheduler does: each due tick's run is started, and its resume job given to the JobSink.
	// It returns how many schedules it fired.
	FireSchedules func(ctx context.Context, engine any) (int, error)

	// Snoozed reports whether err is a job's request to be run again later, and when.
	Snoozed func(err error) (time.Duration, bool)

	// Replay replays run (a *workflow.RunRow) against def (a workflow.Definition) as the engine
	// replays a run's history, with no effects: no step runs, nothing is written. It returns
	// nil when the code matches the history up to its end, a *workflow.NonDeterminismError where
	// it diverges, and another error when the replay could not be done.
	Replay func(ctx context.Context, def any, run any) error
)
