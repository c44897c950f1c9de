package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/telemetry"
)

// A waiting run (a sleep, an await) holds nothing: its wait step commits, in one transaction,
// the step's checkpoint (or, for an await, nothing yet), the run's state (sleeping or awaiting,
// its lease cleared) and the River job that wakes it at its time. The goroutine that ran it
// returns. The wake job takes the run with a new lease and replays it from its history, as a
// resume does; the replayed wait step then passes, or consumes its signal, or times out.
//
// A wake job that finds the run no longer waiting at the step it was made for (woken already,
// finished, cancelled, or a new run under a reused key) does nothing: stale jobs are harmless,
// so a wait may leave several behind.

// WakeArgs is the River job that wakes a waiting run: at its wake-up time or deadline (a
// sleep's end, an await's timeout), or at once when a signal it awaits is sent. It does nothing
// when the run no longer waits at step Seq of generation Generation.
//
//	jobs, err := client.JobList(ctx, river.NewJobListParams().Kinds(workflow.WakeArgs{}.Kind()))
type WakeArgs struct {
	Scope      string `json:"scope"`
	ID         string `json:"id"`
	Generation int64  `json:"generation"` // the run's creation time in µs: a reused key is a new run
	Seq        int    `json:"seq"`        // the waiting step's position
	Reason     string `json:"reason"`     // "timer", "signal" or "scan", for operators

	// Suspended tells a signal's wake job for one suspension from one for an earlier
	// suspension at the same step (the run's updated_at in µs when it began to wait), so that
	// River's uniqueness never folds the two. 0 for timer and scan jobs.
	Suspended int64 `json:"suspended,omitempty"`
}

// Kind implements river.JobArgs.
func (WakeArgs) Kind() string { return "idem_workflow_wake" }

// Hooks gives wake jobs River's insert hook that makes a job due within River's scheduler
// interval available at once (see wakeSoon).
func (WakeArgs) Hooks() []rivertype.Hook { return []rivertype.Hook{&wakeSoon{}} }

// schedulerLookAhead is River's scheduler interval (5s, not configurable in River v0.51): the
// scheduler moves scheduled jobs due within it to available, and producers then fetch them when
// they are due. A job inserted after the scheduler's last pass and due before its next waited for
// that pass, up to 5s late.
const schedulerLookAhead = 5 * time.Second

// wakeSoon inserts a wake job that is due within schedulerLookAhead as available, as the
// scheduler would have made it: producers still fetch it only once scheduled_at has passed (by
// Postgres's clock), at their next poll (FetchPollInterval), so a short sleep wakes within that
// poll instead of within the scheduler's interval.
type wakeSoon struct{ river.HookDefaults }

func (*wakeSoon) InsertBegin(_ context.Context, p *rivertype.JobInsertParams) error {
	if p.State == rivertype.JobStateScheduled && p.ScheduledAt != nil && time.Until(*p.ScheduledAt) < schedulerLookAhead {
		p.State = rivertype.JobStateAvailable
	}
	return nil
}

// waitTx runs one transaction of a wait step, in the run's transaction (see runtx.go): it locks
// the run (the fence: this process must hold the lease), lets decide write the rest, and commits
// with the Call checkpoints that waited for a transaction. decide returns whether it suspended
// the run; if so the run's execution ends once the transaction commits.
func (rs *runState) waitTx(ctx context.Context, step string, decide func(t pgx.Tx, w *store.WaitRow) (suspended bool, err error)) error {
	e, rt := rs.e, rs.tx
	rs.drain() // a run that suspends gives up its lease: its branches finish first
	if err := rt.begin(ctx); err != nil {
		return rs.stop(&machineryError{fmt.Errorf("workflow: error beginning step %q: %w", step, err)})
	}
	w, ok, err := e.st.WaitLock(ctx, rt.view, rs.lease())
	switch {
	case err != nil:
		rt.rollback(ctx)
		return rs.stop(&machineryError{fmt.Errorf("workflow: error locking the run for step %q: %w", step, err)})
	case !ok:
		rt.rollback(ctx)
		return rs.stop(fmt.Errorf("workflow: step %q cannot be committed: %w", step, ErrLeaseLost))
	}
	rs.dbNow = w.Now
	if w.Deadline != nil && *w.Deadline <= w.Now {
		rt.rollback(ctx)
		return rs.endWith(endDeadline, errDeadline)
	}
	suspended, err := decide(rt.view, &w)
	if err != nil {
		rt.rollback(ctx)
		if rs.stopped() != nil {
			return rs.stopped()
		}
		return rs.stop(&machineryError{fmt.Errorf("workflow: error in step %q: %w", step, err)})
	}
	if suspended {
		// Said before COMMIT: once it lands the lease is gone, and the heartbeat must not call
		// that a lost lease. If COMMIT fails, the run is as good as suspended for the caller: in
		// progress, resumed later, from its lease or from the wake job.
		rs.markEnded(endSuspended, errSuspended)
	}
	if err := rt.commit(context.WithoutCancel(ctx)); err != nil {
		return rs.stop(&machineryError{fmt.Errorf("workflow: error committing step %q: %w", step, err)})
	}
	if suspended {
		return rs.endWith(endSuspended, errSuspended)
	}
	return nil
}

// suspend leaves the run waiting in t at step seq (for signal, in an await) until wakeAt µs
// (nil: until a signal), and schedules the job that wakes it at wakeAt or at the deadline,
// whichever comes first.
func (rs *runState) suspend(ctx context.Context, t pgx.Tx, w *store.WaitRow, state store.RunState, seq int, signal *string, wakeAt *int64) error {
	e := rs.e
	jobs, err := e.jobs(ctx)
	if err != nil {
		return rs.stop(&machineryError{err})
	}
	ok, err := e.st.RunSuspend(ctx, t, store.SuspendParams{LeaseParams: rs.lease(), State: state, Seq: seq, Signal: signal, WakeAt: wakeAt})
	if err != nil {
		return fmt.Errorf("error suspending the run: %w", err)
	}
	if !ok {
		return rs.stop(ErrLeaseLost)
	}
	at := wakeAt
	if w.Deadline != nil && (at == nil || *w.Deadline < *at) {
		at = w.Deadline
	}
	rs.retryAfter = time.Second
	if at == nil {
		return nil // an await without a timeout: only a signal wakes it
	}
	rs.retryAfter = max(time.Second, time.Duration(*at-w.Now)*time.Microsecond)
	err = jobs.insertTx(ctx, t, WakeArgs{Scope: rs.scope, ID: rs.id, Generation: rs.created, Seq: seq, Reason: "timer"},
		&river.InsertOpts{Queue: e.cfg.Queue, ScheduledAt: time.UnixMicro(*at)})
	if err != nil {
		return fmt.Errorf("error inserting the job that wakes the run: %w", err)
	}
	return nil
}

// signalWakeOpts make the wake jobs of signals (or of the scan) to one waiting step one job
// while it has not run: a burst of signals wakes the run once, and the run takes the others from
// its mailbox. Completed jobs are left out of the uniqueness, so a finished wake never swallows
// a new one.
func (e *Engine) signalWakeOpts() *river.InsertOpts {
	return &river.InsertOpts{Queue: e.cfg.Queue, UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}}}
}

// suspendedError is what Run returns for a run that is now waiting: in flight, to be asked again.
func (rs *runState) suspendedError() error {
	return &idem.InFlightError{Scope: rs.scope, ID: rs.id, RetryAfter: max(time.Second, rs.retryAfter)}
}

type wakeWorker struct {
	river.WorkerDefaults[WakeArgs]
	e *Engine
}

// Timeout is -1 for the reason resumeWorker's is: the run's lease is its liveness.
func (w *wakeWorker) Timeout(*river.Job[WakeArgs]) time.Duration { return -1 }

func (w *wakeWorker) Work(ctx context.Context, job *river.Job[WakeArgs]) error {
	return w.e.recordable(w.e.wake(ctx, job.Args), redact.Key{Scope: job.Args.Scope, ID: job.Args.ID})
}

// wake continues a waiting run, or times it out when its deadline passed, or does nothing when
// the run no longer waits where the job says.
func (e *Engine) wake(ctx context.Context, a WakeArgs) error {
	w, found, err := e.st.WaitInspect(ctx, e.db, a.Scope, a.ID)
	if err != nil {
		return fmt.Errorf("workflow: error looking up run: %w", err)
	}
	if !found || !w.State.Waiting() || w.Created != a.Generation || (a.Seq != 0 && w.Seq != a.Seq) {
		return nil
	}
	name := w.Workflow
	if w.Overdue {
		// No need to replay the run to stop it: it is at a boundary already.
		err := pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error {
			// The parent first, as every transaction that ends a child locks it (see wakeParent).
			if err := e.wakeParent(ctx, t, a.Scope, a.ID); err != nil {
				return err
			}
			ended, err := e.st.RunTimeOut(ctx, t, a.Scope, a.ID, w.Created, encodeFailure(deadlineMessage), e.cfg.TTL)
			if err != nil || !ended {
				return err
			}
			_, err = e.endRun(ctx, t, idem.Key{Scope: a.Scope, ID: a.ID}, store.RunTimedOut, false, false)
			return err
		})
		if err != nil {
			return fmt.Errorf("workflow: error storing a run as timed out: %w", err)
		}
		return nil
	}
	if !e.resumes(w.Version) {
		e.leaveToVersion(ctx, name, a.Scope, a.ID, w.Version, "wake")
		return river.JobSnooze(e.cfg.ScanInterval)
	}
	def, ok := e.workflows[name]
	if !ok {
		// Another deployment may know the workflow (a rolling deploy). A waiting run has no
		// lease to give up on, so it waits for a deployment that knows its workflow, however
		// long that takes; say so, since a workflow removed from every deployment leaves it
		// waiting for good (RunCancel ends it).
		e.log.WarnContext(ctx, "workflow: a waiting run is due but its workflow is not registered in this process; it waits for one that knows it",
			"workflow", name, "scope", a.Scope, e.keys.Log(redact.Key{Scope: a.Scope, ID: a.ID}))
		return river.JobSnooze(e.cfg.ScanInterval)
	}
	rs := e.newRun(def, a.Scope, a.ID, newToken())
	c, ok, err := e.st.RunWake(ctx, e.db, store.WakeParams{LeaseParams: rs.lease(), Generation: a.Generation, Seq: a.Seq, Owner: e.owner, Lease: e.cfg.Lease,
		Version: e.cfg.Version})
	if err != nil {
		return fmt.Errorf("workflow: error waking run: %w", err)
	}
	if !ok {
		return nil // another job woke it first
	}
	rs.claimed(c)
	input, trace := c.Input, c.Trace
	// A wake-up is a resume: its span joins the trace that started the run.
	ctx, span := e.startResumeSpan(ctx, trace, telemetry.Workflow.String(name), telemetry.Scope.String(a.Scope), e.keys.Attr(rs.rkey()),
		telemetry.Attempts.Int(rs.attempt), attribute.String("idem.wake", a.Reason))
	e.countResume(ctx, name, "wake")
	// The run is ours from here; an error leaves it to its lease and the recovery scan.
	if rs.history, err = e.history(ctx, a.Scope, a.ID); err != nil {
		e.endSpan(span, "stopped", err, rs.rkey())
		return err
	}
	res := e.execute(ctx, rs, input)
	if res.err != nil && !quietEnd(res.err) {
		e.log.WarnContext(ctx, "workflow: woken run stopped before its end", "workflow", name, "scope", a.Scope, e.keys.Log(rs.rkey()),
			e.keys.Error(res.err, rs.rkey()))
	}
	e.endSpan(span, runOutcome(res.err, false), nil, rs.rkey())
	return nil
}

// quietEnd reports whether err ends a run's execution in a way nobody needs to hear of: a stored
// outcome, or a wait.
func quietEnd(err error) bool {
	return errors.Is(err, ErrFailed) || errors.Is(err, ErrCancelled) || errors.Is(err, ErrDeadlineExceeded) || errors.Is(err, idem.ErrInFlight)
}

// scanOverdue inserts a wake job for each waiting run that has been due for longer than a scan
// interval: its own wake job should have woken it by then, so it was lost (deleted by hand,
// discarded by River after failing) or River is far behind. The jobs are unique while they
// wait, so a late River gets one extra job per run, which does nothing if the run's own job
// comes first.
func (e *Engine) scanOverdue(ctx context.Context) error {
	client, err := e.riverClient(ctx)
	if err != nil {
		return err
	}
	overdue, err := e.st.RunOverdue(ctx, e.db, e.cfg.ScanBatchSize, e.cfg.ScanInterval)
	if err != nil {
		return fmt.Errorf("workflow: error scanning for overdue waiting runs: %w", err)
	}
	params := make([]river.InsertManyParams, 0, len(overdue))
	for _, o := range overdue {
		params = append(params, river.InsertManyParams{Args: WakeArgs{Scope: o.Scope, ID: o.ID, Generation: o.Created, Seq: o.Seq, Reason: "scan"},
			InsertOpts: e.signalWakeOpts()})
	}
	// Parents that wait for a child that ended: the job its end inserted was lost.
	parents, err := e.st.RunOverdueParents(ctx, e.db, e.cfg.ScanBatchSize, e.cfg.ScanInterval)
	if err != nil {
		return fmt.Errorf("workflow: error scanning for parents of ended children: %w", err)
	}
	for _, p := range parents {
		params = append(params, river.InsertManyParams{Args: WakeArgs{Scope: p.Scope, ID: p.ID, Generation: p.Created, Seq: p.WaitSeq, Reason: "scan",
			Suspended: p.Suspended}, InsertOpts: e.signalWakeOpts()})
	}
	if len(params) == 0 {
		return nil
	}
	if _, err := client.InsertMany(ctx, params); err != nil {
		return fmt.Errorf("workflow: error inserting wake jobs for overdue runs: %w", err)
	}
	return nil
}
