package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/wfseam"
)

// The seam (internal/wfseam) lets the test engine of package workflowtest run this engine with
// a virtual clock, its own jobs instead of River's, and fakes for Call steps, and lets the
// replayer match histories against code with this engine's own replay logic: what changes is how
// the engine meets the world, never how it runs a workflow.
func init() {
	wfseam.Install = func(engine any, o wfseam.Options) error {
		e, ok := engine.(*Engine)
		if !ok || e == nil {
			return fmt.Errorf("workflow: seam given a %T, not an engine", engine)
		}
		if o.VirtualClock {
			e.st = store.ForVirtualClock(e.cfg.Schema)
		}
		if o.Now != nil {
			e.now = o.Now
		}
		e.seam = o
		return nil
	}
	wfseam.Work = func(ctx context.Context, engine any, kind string, args []byte) error {
		e := engine.(*Engine)
		switch kind {
		case WakeArgs{}.Kind():
			var a WakeArgs
			if err := json.Unmarshal(args, &a); err != nil {
				return fmt.Errorf("workflow: error decoding a wake job: %w", err)
			}
			return e.wake(ctx, a)
		case ResumeArgs{}.Kind():
			var a ResumeArgs
			if err := json.Unmarshal(args, &a); err != nil {
				return fmt.Errorf("workflow: error decoding a resume job: %w", err)
			}
			return e.resume(ctx, a.Scope, a.ID, a.Reason)
		}
		return fmt.Errorf("workflow: no worker for jobs of kind %q", kind)
	}
	wfseam.FireSchedules = func(ctx context.Context, engine any) (int, error) {
		return engine.(*Engine).fireSchedules(ctx)
	}
	wfseam.Snoozed = func(err error) (time.Duration, bool) {
		var snooze *rivertype.JobSnoozeError
		if errors.As(err, &snooze) {
			return snooze.Duration, true
		}
		return 0, false
	}
	wfseam.Replay = func(ctx context.Context, def, run any) error {
		d, ok := def.(Definition)
		if !ok || d == nil {
			return fmt.Errorf("workflow: a replay needs a workflow; got %T", def)
		}
		r, ok := run.(*RunRow)
		if !ok || r == nil {
			return fmt.Errorf("workflow: a replay needs a run's history; got %T", run)
		}
		return replay(ctx, d, r)
	}
}

// jobInserter inserts the engine's own jobs (wake-ups, resumes) in a transaction: with the River
// client, or, in a test engine, into its sink.
type jobInserter struct {
	client *river.Client[pgx.Tx]
	sink   wfseam.JobSink
}

// jobs returns the engine's jobInserter, or why it has none.
func (e *Engine) jobs(ctx context.Context) (jobInserter, error) {
	if e.seam.Jobs != nil {
		return jobInserter{sink: e.seam.Jobs}, nil
	}
	client, err := e.riverClient(ctx)
	return jobInserter{client: client}, err
}

func (j jobInserter) insertTx(ctx context.Context, t pgx.Tx, args river.JobArgs, opts *river.InsertOpts) error {
	if j.sink == nil {
		_, err := j.client.InsertTx(ctx, t, args, opts)
		return err
	}
	data, err := json.Marshal(args)
	if err != nil {
		return err
	}
	var at time.Time
	if opts != nil && opts.ScheduledAt.After(time.Time{}) {
		at = opts.ScheduledAt
	}
	return j.sink.InsertTx(ctx, t, args.Kind(), data, at)
}

// insertManyTx inserts several jobs at once: in one statement with River.
func (j jobInserter) insertManyTx(ctx context.Context, t pgx.Tx, params []river.InsertManyParams) error {
	if j.sink == nil {
		_, err := j.client.InsertManyTx(ctx, t, params)
		return err
	}
	for _, p := range params {
		if err := j.insertTx(ctx, t, p.Args, p.InsertOpts); err != nil {
			return err
		}
	}
	return nil
}

// callBody is the function a step built on RunStep or GoStep (steps.Call, steps.GoCall) runs:
// body, or the test engine's fake of the step named name.
func (e *Engine) callBody(name string, body func(ctx context.Context, info *StepInfo) ([]byte, error)) func(ctx context.Context, info *StepInfo) ([]byte, error) {
	fake, ok := e.seam.Calls[name]
	if !ok {
		return body
	}
	return func(ctx context.Context, s *StepInfo) ([]byte, error) { return fake(ctx, s.Key) }
}
