// Package idemriver runs idem's upkeep as River jobs, for applications that use idem.Do (or
// idemhttp, idemgrpc) without the workflow engine: a periodic job that calls idem.Reap, so that
// expired keys do not pile up. The workflow engine registers the same job itself (see
// workflow.Engine.AddWorkers); add it here only when there is no engine.
//
//	workers := river.NewWorkers()
//	if err := idemriver.AddReapWorker(workers, pool, nil); err != nil {
//		return err
//	}
//	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
//		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
//		Workers:      workers,
//		PeriodicJobs: []*river.PeriodicJob{idemriver.ReapPeriodicJob(nil)},
//	})
//
// [Migrate] brings idem's tables and River's up to date under one advisory lock, for every
// application that uses both, engine or not: River's own migrator takes no lock, and processes
// that start at once would race on it.
//
//	err := idemriver.Migrate(ctx, pool, nil)
package idemriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/idemkit/idem"
)

// DefaultReapInterval is how often the reap job runs when ReapConfig.Interval is zero.
const DefaultReapInterval = time.Minute

// ReapArgs is the River job that deletes expired keys with idem.Reap. [ReapPeriodicJob] inserts
// it every interval; insert one yourself to reap at once:
//
//	_, err := client.Insert(ctx, idemriver.ReapArgs{}, nil)
type ReapArgs struct{}

// Kind implements river.JobArgs.
func (ReapArgs) Kind() string { return "idem_reap" }

// ReapConfig configures the reap job. nil means the defaults.
//
//	cfg := &idemriver.ReapConfig{Interval: 30 * time.Second, Options: []idem.Option{idem.Schema("billing")}}
type ReapConfig struct {
	// Interval is how often the job runs, at least one second; default DefaultReapInterval. Each
	// run reaps until nothing expired is left or the interval is over, whichever comes first,
	// so a backlog is worked off over several runs.
	Interval time.Duration

	// Queue is the River queue of the job; default river.QueueDefault.
	Queue string

	// Options are passed to idem.Reap: idem.Schema, idem.ReapBusy, idem.ReapBatchTime.
	Options []idem.Option

	// Logger receives a line per run that deleted anything. Default slog.Default().
	Logger *slog.Logger
}

func (c *ReapConfig) withDefaults() (ReapConfig, error) {
	var out ReapConfig
	if c != nil {
		out = *c
	}
	switch {
	case out.Interval == 0:
		out.Interval = DefaultReapInterval
	case out.Interval < time.Second:
		return out, fmt.Errorf("idemriver: ReapConfig.Interval cannot be less than one second (got %s)", out.Interval)
	}
	if out.Queue == "" {
		out.Queue = river.QueueDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if err := idem.CheckOptions(out.Options...); err != nil {
		return out, fmt.Errorf("idemriver: ReapConfig.Options: %w", err)
	}
	return out, nil
}

// AddReapWorker registers the reap job's worker, which deletes from db, in the application's
// workers bundle. Use the same cfg for [ReapPeriodicJob].
//
//	err := idemriver.AddReapWorker(workers, pool, &idemriver.ReapConfig{Interval: 30 * time.Second})
func AddReapWorker(workers *river.Workers, db idem.Querier, cfg *ReapConfig) error {
	if workers == nil || db == nil {
		return errors.New("idemriver: AddReapWorker needs workers and a database")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	return river.AddWorkerSafely[ReapArgs](workers, &ReapWorker{db: db, cfg: c})
}

// ReapPeriodicJob returns the periodic job that inserts [ReapArgs] every interval, for
// river.Config.PeriodicJobs. River runs periodic jobs on its elected leader, so the job runs
// once per interval in the whole cluster.
//
//	PeriodicJobs: []*river.PeriodicJob{idemriver.ReapPeriodicJob(nil)},
func ReapPeriodicJob(cfg *ReapConfig) *river.PeriodicJob {
	c, err := cfg.withDefaults()
	if err != nil {
		// AddReapWorker, given the same cfg, reports the error; the job keeps the defaults.
		c, _ = (*ReapConfig)(nil).withDefaults()
	}
	return river.NewPeriodicJob(river.PeriodicInterval(c.Interval), func() (river.JobArgs, *river.InsertOpts) {
		return ReapArgs{}, &river.InsertOpts{Queue: c.Queue, UniqueOpts: river.UniqueOpts{ByPeriod: c.Interval}}
	}, &river.PeriodicJobOpts{ID: "idem_reap", RunOnStart: true})
}

// ReapWorker is the River worker of [ReapArgs]. Register it with [AddReapWorker].
//
//	err := idemriver.AddReapWorker(workers, pool, nil)
type ReapWorker struct {
	river.WorkerDefaults[ReapArgs]
	db  idem.Querier
	cfg ReapConfig
}

// NewReapWorker returns the worker for registries that take a worker value (the workflow engine
// adds it this way). Most applications call [AddReapWorker] instead.
//
//	river.AddWorker(workers, idemriver.NewReapWorker(pool, nil))
func NewReapWorker(db idem.Querier, cfg *ReapConfig) (*ReapWorker, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &ReapWorker{db: db, cfg: c}, nil
}

// Timeout is the interval: a run that has not drained a backlog by then stops, and the next
// run, an interval later, goes on.
func (w *ReapWorker) Timeout(*river.Job[ReapArgs]) time.Duration { return w.cfg.Interval }

// Work reaps. Running out of time is not a failure: what is left waits for the next run.
func (w *ReapWorker) Work(ctx context.Context, job *river.Job[ReapArgs]) error {
	start := time.Now()
	n, err := idem.Reap(ctx, w.db, w.cfg.Options...)
	if n > 0 {
		w.cfg.Logger.InfoContext(ctx, "idem: reaped expired keys", "keys", n, "took", time.Since(start).Round(time.Millisecond))
	}
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}
