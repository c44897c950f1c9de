package workflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/telemetry"
	"github.com/idemkit/idem/internal/wfseam"
)

// Defaults used when the corresponding Config field is zero.
//
//	cfg := &workflow.Config{Lease: 2 * workflow.DefaultLease}
const (
	DefaultLease             = 30 * time.Second
	DefaultMaxAttempts       = 10
	DefaultUnregisteredGrace = 10 * time.Minute
	DefaultScanInterval      = 15 * time.Second
	DefaultScanBatchSize     = 100
	DefaultReapInterval      = time.Minute
	DefaultStepAttemptsKept  = 10
)

// DB is what an Engine needs from Postgres: several connections at once (a run renews its lease
// while a step works), so in practice a *pgxpool.Pool.
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	engine, err := workflow.NewEngine(pool, nil) // *pgxpool.Pool is a DB
type DB interface {
	idem.Beginner
	idem.Querier
}

// Config configures an [Engine]. The zero value of every field means its default.
//
//	cfg := &workflow.Config{
//		Workflows:   []workflow.Definition{Payout, Refund},
//		Lease:       10 * time.Second, // a dead process's runs resume within ~10s + ScanInterval
//		MaxAttempts: 5,
//		Reconcile:   reconcileStuckPayouts,
//	}
type Config struct {
	// Workflows are the workflows this deployment can run and resume. A run whose workflow is
	// not in this list is left to other processes for UnregisteredGrace, then reconciled.
	Workflows []Definition

	// Lease is how long a run is owned by the process running it without a renewal. The owner
	// renews it every Lease/3 while the run is alive, so a step may take longer than Lease. When
	// the owner dies, the run is resumed elsewhere after Lease plus up to ScanInterval. Shorter
	// means faster recovery, and more renewals. At least one second; default 30s.
	Lease time.Duration

	// TTL is how long a finished run (done or failed) is kept, and so how long a retry with its
	// key replays the result. Expired runs are deleted by the reaper and their keys may be used
	// again. At least one second; default idem.DefaultTTL.
	TTL time.Duration

	// MaxAttempts bounds how many times a run is started or taken over after a lost lease
	// before it goes to Reconcile instead. Default 10.
	MaxAttempts int

	// UnregisteredGrace is how long a run whose workflow is not in Workflows is left for
	// another deployment (one with the workflow) to resume, counted from when its lease expired.
	// After that it is reconciled. Default 10 minutes.
	UnregisteredGrace time.Duration

	// Reconcile decides what happens to a run that cannot be resumed (see [ReconcileFunc]). When
	// nil, such runs are failed with a stored error that says why.
	Reconcile ReconcileFunc

	// Queue is the River queue of the engine's jobs (resume, scan, reap). It must be in the
	// River client's Queues. Default river.QueueDefault.
	Queue string

	// ScanInterval is how often the recovery scan looks for runs whose lease expired. At least
	// one second (River's periodic jobs do not go lower); default 15s.
	ScanInterval time.Duration

	// ScanBatchSize bounds how many runs one scan hands to resume jobs. Default 100.
	ScanBatchSize int

	// StepAttemptsKept is how many failed attempts of each step a run keeps, with their errors,
	// for Engine.RunGet and `idem runs show`: the newest ones. Default 10.
	StepAttemptsKept int

	// MaxParallelSteps bounds the parallel branches (steps.GoTx, steps.GoCall) of one run in
	// flight at once; starting one more waits for a slot. Default 8.
	MaxParallelSteps int

	// ReapInterval is how often expired keys (of finished runs, and of idem.Do) are deleted, by
	// idem.Reap in idemriver's reap job. At least one second; default 1 minute.
	ReapInterval time.Duration

	// Version names the code this engine runs, for the runs it starts and the attempts it makes:
	// every run records the version that started it and the version of its latest attempt
	// (RunRow.Version, RunRow.AttemptVersion), and RunList filters on it. Default: the VCS
	// revision the binary was built from (debug.ReadBuildInfo's vcs.revision, with "-dirty" for a
	// modified work tree), else the main module's version, else [UnknownVersion]. At most 255
	// bytes.
	Version string

	// ResumeVersions, when set, restricts the runs this engine resumes, wakes or takes over to
	// those started by these versions (and its own Version, always included): the others are
	// left, with a log line, to an engine of their version, as DBOS's application versions do. Use
	// it when a deploy changes workflows incompatibly and old runs must finish on old code that
	// keeps running beside the new. Runs stored before versions were recorded are anyone's.
	// Default: every run, whatever its version.
	//
	//	cfg := &workflow.Config{Version: "2026-11-23.1", ResumeVersions: []string{"2026-11-23.1"}}
	ResumeVersions []string

	// MaxInputBytes bounds a run's input, as JSON: Workflow.Run, StartTx, a child run's start
	// and Schedule refuse a bigger one with a *LimitError before anything is stored. Default
	// 1 MiB.
	MaxInputBytes int

	// MaxStepOutputBytes bounds a step's output, as JSON (steps.Tx's and steps.Call's results,
	// steps.SetEvent's value). A step whose output is bigger fails for good at once, as if it
	// returned steps.Permanent(*LimitError): the output would not shrink on a retry. A Tx step's
	// writes roll back with it; a Call's outside effect has happened, but its output is not
	// stored, so handle the failure (or raise the limit and resume the run) knowing that. Default
	// 1 MiB.
	MaxStepOutputBytes int

	// MaxSignalPayloadBytes bounds a signal's payload, as JSON: SignalTx refuses a bigger one
	// with a *LimitError and records nothing. Default 1 MiB.
	MaxSignalPayloadBytes int

	// MaxPendingSignals bounds how many signals a run's mailbox holds that no await has consumed:
	// SignalTx refuses another with a *LimitError and records nothing, so a sender cannot fill the
	// mailbox of a run that never awaits. Senders that signal the same run at the same moment may
	// each find room for one more. Duplicates (SignalOpts.DedupeID) are answered as duplicates,
	// however full the mailbox. Default 10,000.
	MaxPendingSignals int

	// Schema is the Postgres schema of idem's tables, as given to idem.Migrate with idem.Schema.
	// Default "": search_path decides.
	Schema string

	// Logger receives what the engine does that no caller hears of: runs resumed or taken over
	// (Info), reconciled (Info), stopped by a lost lease or before their end (Warn). Default
	// slog.Default(). A record names a run by its scope and the hash of its key (key_hash), never
	// by its key's ID, unless RecordKeys is set.
	Logger *slog.Logger

	// RecordKeys makes the engine's spans and log records carry key IDs as they are (idem.key.id
	// and id, and in the error texts they record), instead of the short hash that stands for a
	// key by default (idem.key.hash and key_hash: 16 hex digits of a SHA-256 of the scope and ID,
	// which idem runs show prints). For deployments whose keys are not secrets. Metrics never
	// carry keys, hashed or not.
	RecordKeys bool

	// TracerProvider and MeterProvider receive the engine's spans (idem.workflow.run, .resume,
	// .step, .scan) and metrics (idem.step.executions, .retries, .duration;
	// idem.workflow.resumes, .reconciliations, .runs). Default: the global providers, which
	// cost next to nothing until the application installs an SDK.
	//
	//	cfg := &workflow.Config{Workflows: defs, TracerProvider: tp, MeterProvider: mp}
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Engine runs workflows: it holds the database, the registered workflows and (through
// [Engine.SetClient]) the application's River client, and its River workers resume runs whose
// process died.
//
// Set it up once, beside the River client, so that the application keeps a single client:
//
//	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{Payout}})
//	workers := river.NewWorkers()
//	engine.AddWorkers(workers)
//	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
//		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 50}},
//		Workers:      workers,
//		PeriodicJobs: engine.PeriodicJobs(),
//	})
//	engine.SetClient(client)
//	err = client.Start(ctx)
type Engine struct {
	db        DB
	cfg       Config
	workflows map[string]Definition
	st        *store.Statements
	client    atomic.Pointer[river.Client[pgx.Tx]]
	log       *slog.Logger
	tel       *telemetry.Set
	keys      redact.Keys // what records carry of keys
	owner     string      // names this process in the leases it takes, for operators

	// heartbeatOff stops lease renewals, to let tests play a paused process.
	heartbeatOff atomic.Bool

	// schedClock, when set, is the time schedules go by instead of Postgres's: a test's clock.
	schedClock atomic.Pointer[func() time.Time]

	now  func() time.Time // the process's clock, as the engine's checks of time read it
	seam wfseam.Options   // how a test engine changes the engine's dealings with the world (seam.go)

	workers atomic.Bool // AddWorkers was called: this process works the engine's jobs
	bg      background  // the recovery scan and the gauge, until Close
}

// NewEngine returns an Engine for db. cfg may be nil for all defaults (and no workflows, which
// is only useful for reaping). Invalid settings are reported by name.
//
//	engine, err := workflow.NewEngine(pool, &workflow.Config{
//		Workflows: []workflow.Definition{Payout, Refund},
//		Lease:     10 * time.Second,
//	})
func NewEngine(db DB, cfg *Config) (*Engine, error) {
	if db == nil {
		return nil, errors.New("workflow: db cannot be nil")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if err := c.setDefaults(); err != nil {
		return nil, err
	}
	e := &Engine{db: db, cfg: c, workflows: make(map[string]Definition, len(c.Workflows)), st: store.For(c.Schema), log: c.Logger,
		tel: telemetry.For(c.TracerProvider, c.MeterProvider), owner: leaseOwner(), now: time.Now, keys: redact.Keys{Full: c.RecordKeys}}
	for i, d := range c.Workflows {
		if d == nil {
			return nil, fmt.Errorf("workflow: Workflows[%d] cannot be nil", i)
		}
		if _, dup := e.workflows[d.Name()]; dup {
			return nil, fmt.Errorf("workflow: Workflows has %q twice; names must be unique", d.Name())
		}
		e.workflows[d.Name()] = d
	}
	e.observeRuns()
	return e, nil
}

// leaseOwner names this process: host and pid, which is what an operator needs to find it.
func leaseOwner() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

func (c *Config) setDefaults() error {
	dur := func(d *time.Duration, name string, def, floor time.Duration) error {
		switch {
		case *d == 0:
			*d = def
		case *d < floor:
			return fmt.Errorf("workflow: %s cannot be less than %s (got %s)", name, floor, *d)
		}
		return nil
	}
	num := func(n *int, name string, def int) error {
		switch {
		case *n == 0:
			*n = def
		case *n < 0:
			return fmt.Errorf("workflow: %s cannot be negative (got %d)", name, *n)
		}
		return nil
	}
	return errors.Join(
		dur(&c.Lease, "Lease", DefaultLease, time.Second),
		dur(&c.TTL, "TTL", idem.DefaultTTL, time.Second),
		dur(&c.UnregisteredGrace, "UnregisteredGrace", DefaultUnregisteredGrace, 0),
		dur(&c.ScanInterval, "ScanInterval", DefaultScanInterval, time.Second),
		dur(&c.ReapInterval, "ReapInterval", DefaultReapInterval, time.Second),
		num(&c.MaxAttempts, "MaxAttempts", DefaultMaxAttempts),
		num(&c.ScanBatchSize, "ScanBatchSize", DefaultScanBatchSize),
		num(&c.StepAttemptsKept, "StepAttemptsKept", DefaultStepAttemptsKept),
		num(&c.MaxParallelSteps, "MaxParallelSteps", DefaultMaxParallelSteps),
		num(&c.MaxInputBytes, "MaxInputBytes", DefaultMaxInputBytes),
		num(&c.MaxStepOutputBytes, "MaxStepOutputBytes", DefaultMaxStepOutputBytes),
		num(&c.MaxSignalPayloadBytes, "MaxSignalPayloadBytes", DefaultMaxSignalPayloadBytes),
		num(&c.MaxPendingSignals, "MaxPendingSignals", DefaultMaxPendingSignals),
		func() error {
			if c.Queue == "" {
				c.Queue = river.QueueDefault
			}
			if len(c.Schema) > 63 {
				return fmt.Errorf("workflow: Schema cannot be longer than 63 bytes (got %q)", c.Schema)
			}
			if c.Logger == nil {
				c.Logger = slog.Default()
			}
			if c.Version == "" {
				c.Version = buildVersion()
			}
			if len(c.Version) > 255 {
				return fmt.Errorf("workflow: Version cannot be longer than 255 bytes (got %d)", len(c.Version))
			}
			for i, v := range c.ResumeVersions {
				if v == "" {
					return fmt.Errorf("workflow: ResumeVersions[%d] cannot be empty; list the versions whose runs this engine resumes", i)
				}
			}
			if len(c.ResumeVersions) > 0 && !slices.Contains(c.ResumeVersions, c.Version) {
				c.ResumeVersions = append(slices.Clip(c.ResumeVersions), c.Version)
			}
			return nil
		}(),
	)
}

// pool returns the engine's pool, or nil when its DB is something else: then the run's
// transactions are begun with DB.Begin, and send each statement on its own (see runtx.go).
func (e *Engine) pool() *pgxpool.Pool {
	p, _ := e.db.(*pgxpool.Pool)
	return p
}

// SetClient gives the engine the application's River client, which steps.Enqueue and the
// recovery scan insert jobs with. Call it once the client exists (it needs the workers from
// [Engine.AddWorkers], so it cannot exist before the engine). Inside River workers the engine
// falls back to the client River puts in the context.
//
// When the engine's workers were added (AddWorkers), SetClient also starts the engine's own
// recovery scan, so that the runs of a process that died are resumed moments after their lease
// runs out, without waiting for River's leader (see [Engine.Close] to stop it).
//
//	engine.SetClient(client)
func (e *Engine) SetClient(client *river.Client[pgx.Tx]) {
	e.client.Store(client)
	if client != nil && e.workers.Load() {
		e.startScanning()
	}
}

// riverClient returns the client for inserting jobs from ctx: the one given to SetClient, else
// the one River puts in a worker's context.
func (e *Engine) riverClient(ctx context.Context) (*river.Client[pgx.Tx], error) {
	if c := e.client.Load(); c != nil {
		return c, nil
	}
	if c, err := river.ClientFromContextSafely[pgx.Tx](ctx); err == nil {
		return c, nil
	}
	return nil, errors.New("workflow: the engine has no River client; call Engine.SetClient once the client is created")
}

// DB returns the database the engine was created with.
//
//	var n int
//	err := engine.DB().QueryRow(ctx, "SELECT count(*) FROM idem_steps").Scan(&n)
func (e *Engine) DB() DB { return e.db }

// tablesError explains an error that comes from a database without idem's tables, the commonest
// mistake on a new database, whose raw message does not say what to do; other errors pass.
func (e *Engine) tablesError(err error) error {
	if !store.IsMissingTable(err) {
		return err
	}
	return fmt.Errorf("workflow: idem's tables are missing: run idem.Migrate at startup, with idem.Schema(%q) as in Config.Schema, or apply schema.sql: %w", e.cfg.Schema, err)
}
