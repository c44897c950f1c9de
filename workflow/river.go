package workflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemriver"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/telemetry"
)

// ResumeArgs is the River job that resumes one run whose lease expired. The recovery scan
// inserts it; it is unique by its run and lease, so a run gets one resume job per expired lease,
// however many scans see it, and a new one if it gets stuck again later.
//
//	jobs, err := client.JobList(ctx, river.NewJobListParams().Kinds(workflow.ResumeArgs{}.Kind()))
type ResumeArgs struct {
	Scope       string `json:"scope" river:"unique"`
	ID          string `json:"id" river:"unique"`
	Attempt     int    `json:"attempt" river:"unique"`      // the run's attempts when the scan saw it
	LeaseExpiry int64  `json:"lease_expiry" river:"unique"` // the expired lease, in µs since the epoch

	// Reason says why the job was inserted, for operators and the log: "start" (StartTx),
	// "operator" (RunResume), "fork" (RunFork), "child" (Workflow.StartChild), "admitted" (a
	// queued run whose concurrency key had a slot free), "schedule" (a schedule's tick); "" when
	// the recovery scan found the run's lease expired. It is not part of the job's uniqueness:
	// the scan, which finds an ownerless run's lease expired too, adds no second job for it.
	Reason string `json:"reason,omitempty"`
}

// Why a resume job was inserted; see ResumeArgs.Reason.
const (
	resumeStarted    = "start"
	resumeByOperator = "operator"
	resumeForked     = "fork"
	resumeChild      = "child"
	resumeAdmitted   = "admitted"
	resumeScheduled  = "schedule"
)

// Kind implements river.JobArgs.
func (ResumeArgs) Kind() string { return "idem_workflow_resume" }

// resumeOpts make a resume job unique by its arguments: one per run and lease generation.
func (e *Engine) resumeOpts() *river.InsertOpts {
	return &river.InsertOpts{Queue: e.cfg.Queue, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// insertResume inserts, in t, the job that runs an ownerless run now (StartTx, RunResume,
// RunFork, said by reason); generation is the run's lease expiry, which makes the job unique.
func (e *Engine) insertResume(ctx context.Context, jobs jobInserter, t pgx.Tx, key idem.Key, generation int64, reason string) error {
	err := jobs.insertTx(ctx, t, ResumeArgs{Scope: key.Scope, ID: key.ID, LeaseExpiry: generation, Reason: reason}, e.resumeOpts())
	if err != nil {
		return fmt.Errorf("workflow: error inserting the job that runs the run: %w", err)
	}
	return nil
}

// ScanArgs is the periodic River job that looks for runs whose lease expired. It is inserted by
// the periodic job from [Engine.PeriodicJobs]; insert one yourself to scan at once:
//
//	_, err := client.Insert(ctx, workflow.ScanArgs{}, nil)
type ScanArgs struct{}

// Kind implements river.JobArgs.
func (ScanArgs) Kind() string { return "idem_workflow_scan" }

// AddWorkers registers the engine's River workers (resume, wake, scan, and idemriver's reap job) in
// the application's workers bundle. Run them in the application's own River client: two clients in one schema
// discard each other's jobs.
//
//	workers := river.NewWorkers()
//	river.AddWorker(workers, &SendMailWorker{})
//	if err := engine.AddWorkers(workers); err != nil {
//		return err
//	}
func (e *Engine) AddWorkers(workers *river.Workers) error {
	reaper, err := idemriver.NewReapWorker(e.db, e.reapConfig())
	if err != nil {
		return err
	}
	e.workers.Store(true)
	return errors.Join(
		river.AddWorkerSafely[ResumeArgs](workers, &resumeWorker{e: e}),
		river.AddWorkerSafely[ScanArgs](workers, &scanWorker{e: e}),
		river.AddWorkerSafely[WakeArgs](workers, &wakeWorker{e: e}),
		river.AddWorkerSafely[idemriver.ReapArgs](workers, reaper),
	)
}

func (e *Engine) reapConfig() *idemriver.ReapConfig {
	return &idemriver.ReapConfig{Interval: e.cfg.ReapInterval, Queue: e.cfg.Queue, Options: []idem.Option{idem.Schema(e.cfg.Schema)}, Logger: e.log}
}

// PeriodicJobs returns the engine's periodic jobs, the recovery scan (every ScanInterval) and
// the reaper (every ReapInterval), for river.Config.PeriodicJobs. River runs periodic jobs on
// its elected leader, so each runs once per interval in the whole cluster.
//
//	config := &river.Config{
//		Workers:      workers,
//		PeriodicJobs: append(myPeriodicJobs, engine.PeriodicJobs()...),
//	}
func (e *Engine) PeriodicJobs() []*river.PeriodicJob {
	q := e.cfg.Queue
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(e.cfg.ScanInterval), func() (river.JobArgs, *river.InsertOpts) {
			return ScanArgs{}, &river.InsertOpts{Queue: q, UniqueOpts: river.UniqueOpts{ByPeriod: e.cfg.ScanInterval}}
		}, &river.PeriodicJobOpts{ID: "idem_workflow_scan", RunOnStart: true}),
		idemriver.ReapPeriodicJob(e.reapConfig()),
	}
}

type scanWorker struct {
	river.WorkerDefaults[ScanArgs]
	e *Engine
}

func (w *scanWorker) Work(ctx context.Context, _ *river.Job[ScanArgs]) error {
	err := errors.Join(w.e.scan(ctx), w.e.scanOverdue(ctx))
	_, ferr := w.e.fireSchedules(ctx)
	return errors.Join(err, ferr)
}

// scan inserts a resume job for each run whose lease expired, in the transaction that holds
// those runs with FOR UPDATE SKIP LOCKED: a run is either handed to a job or left for the next
// scan, and two scans never fight over one run.
func (e *Engine) scan(ctx context.Context) (err error) {
	client, err := e.riverClient(ctx)
	if err != nil {
		return err
	}
	ctx, span := e.tel.Tracer.Start(ctx, "idem.workflow.scan", trace.WithSpanKind(trace.SpanKindInternal))
	found := 0
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(attribute.Int("idem.runs", found))
		}
		e.endSpan(span, map[bool]string{true: "ok", false: "error"}[err == nil], err, redact.Key{})
	}()
	return pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error {
		expired, err := e.st.RunScan(ctx, t, e.cfg.ScanBatchSize)
		if err != nil {
			return fmt.Errorf("workflow: error scanning for runs to resume: %w", err)
		}
		params := make([]river.InsertManyParams, 0, len(expired))
		for _, r := range expired {
			params = append(params, river.InsertManyParams{Args: ResumeArgs{Scope: r.Scope, ID: r.ID, Attempt: r.Attempts, LeaseExpiry: r.LeaseExpiry},
				InsertOpts: e.resumeOpts()})
		}
		if found = len(params); found == 0 {
			return nil
		}
		if _, err := client.InsertManyTx(ctx, t, params); err != nil {
			return fmt.Errorf("workflow: error inserting resume jobs: %w", err)
		}
		return nil
	})
}

type resumeWorker struct {
	river.WorkerDefaults[ResumeArgs]
	e *Engine
}

// Timeout is -1 because a run's liveness is its lease, renewed while it works: River's job
// timeout would cut long workflows short for nothing.
func (w *resumeWorker) Timeout(*river.Job[ResumeArgs]) time.Duration { return -1 }

func (w *resumeWorker) Work(ctx context.Context, job *river.Job[ResumeArgs]) error {
	err := w.e.resume(ctx, job.Args.Scope, job.Args.ID, job.Args.Reason)
	return w.e.recordable(err, redact.Key{Scope: job.Args.Scope, ID: job.Args.ID})
}

// resume continues a run whose lease expired, or reconciles it when it cannot be continued.
// Errors that stop the run are logged, not returned: the run's lease is what brings it back,
// through the next scan, with its attempts counted.
func (e *Engine) resume(ctx context.Context, scope, id, reason string) error {
	row, ok, err := e.st.RunInspect(ctx, e.db, scope, id)
	if err != nil {
		return fmt.Errorf("workflow: error looking up run: %w", e.tablesError(err))
	}
	if !ok || row.State != store.RunRunning || row.Expired == nil || !*row.Expired {
		return nil // gone, finished, or owned by a live process
	}
	rk := redact.Key{Scope: scope, ID: id}
	ctx, span := e.startResumeSpan(ctx, row.Trace, telemetry.Workflow.String(row.Workflow), telemetry.Scope.String(scope),
		e.keys.Attr(rk), telemetry.Attempts.Int(row.Attempts))
	outcome, err := e.resumeInspected(ctx, scope, id, &row, reason)
	e.endSpan(span, outcome, err, rk)
	return err
}

// resumeInspected is resume once the run is known to need it; it returns the outcome for the
// resume span.
func (e *Engine) resumeInspected(ctx context.Context, scope, id string, row *store.Inspected, reason string) (string, error) {
	def, ok := e.workflows[row.Workflow]
	switch {
	case !e.resumes(row.Version):
		// Another deployment runs the run's version (DBOS's model): the job comes back, and
		// whichever process of that version takes it resumes the run.
		e.leaveToVersion(ctx, row.Workflow, scope, id, row.Version, "job")
		return "snoozed", river.JobSnooze(e.cfg.ScanInterval)
	case !ok:
		grace := e.cfg.UnregisteredGrace
		if row.ExpiredFor < grace {
			// Another deployment may know the workflow (a rolling deploy): look again later.
			return "snoozed", river.JobSnooze(min(grace-row.ExpiredFor, 4*e.cfg.ScanInterval) + 100*time.Millisecond)
		}
		return "reconciled", e.reconcile(ctx, scope, id, row, ReasonUnregistered)
	case row.Attempts >= e.cfg.MaxAttempts:
		return "reconciled", e.reconcile(ctx, scope, id, row, ReasonMaxAttempts)
	}

	rs, input, err := e.takeOver(ctx, def, scope, id, row.Token, "job")
	if err != nil {
		return "stopped", err
	}
	if rs == nil {
		return "taken", nil // another process was faster
	}
	switch reason {
	case resumeStarted, resumeForked, resumeChild, resumeAdmitted, resumeScheduled:
		// Not a recovery: a run started in a transaction (StartTx, a schedule), or forked, begins here.
		e.log.InfoContext(ctx, "workflow: starting run", "workflow", row.Workflow, "scope", scope, e.keys.Log(rs.rkey()), "by", reason,
			"replayed_steps", row.RecoveryPoint != "")
	default:
		e.log.InfoContext(ctx, "workflow: resuming run", "workflow", row.Workflow, "scope", scope, e.keys.Log(rs.rkey()), "attempt", rs.attempt,
			"recovery_point", row.RecoveryPoint, "lease_expired_for", row.ExpiredFor.Round(time.Millisecond), "by", cmp.Or(reason, "scan"))
	}
	res := e.execute(ctx, rs, input)
	if res.err != nil && !quietEnd(res.err) {
		e.log.WarnContext(ctx, "workflow: resumed run stopped before its end", "workflow", row.Workflow, "scope", scope, e.keys.Log(rs.rkey()),
			"attempt", rs.attempt, e.keys.Error(res.err, rs.rkey()))
	}
	return runOutcome(res.err, false), nil
}
