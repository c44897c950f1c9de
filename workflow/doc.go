// Package workflow runs work that cannot fit in one transaction (it calls a payment provider,
// sends mail, waits) so that it is safe to retry and survives crashes: the effect happens once,
// and every retry with the same key gets the same answer.
//
// A workflow is an ordinary Go function that calls named steps from package steps. Each
// completed step is a committed recovery point: when the process running a workflow dies,
// another process resumes the run from its last completed step, replaying the stored outputs
// of the steps before it.
//
//	var Payout = workflow.Define("payout", func(ctx context.Context, req PayoutReq) (Receipt, error) {
//		hold, err := steps.Tx(ctx, "reserve", reserveFunc(req), nil)      // exactly once
//		...
//		charge, err := steps.Call(ctx, "charge", chargeFunc(hold), nil)   // at least once, same key
//		...
//		err = steps.Enqueue(ctx, "notify", NotifyArgs{ID: req.ID}, nil, nil) // River job, exactly once
//		...
//		return steps.Tx(ctx, "settle", settleFunc(hold, charge), nil)
//	})
//
//	receipt, err := Payout.Run(ctx, engine, idem.Key{Scope: merchantID, ID: requestKey}, req, nil)
//
// [Workflow.Run] runs the workflow in the calling process and returns its output; a retry with
// the same key replays it. [Workflow.StartTx] instead starts it inside a transaction of the
// caller's, to be run by a River worker once that transaction commits.
//
// # How it works
//
// A run's key is a row of idem_keys (the table idem.Do uses, so that a key names one operation,
// Do's or a run's), and the run itself a row of idem_runs: its state, the workflow's name, its
// input and output, and a lease: a random token and an expiry (Config.Lease), renewed every
// Lease/3 by the process that owns the run. Each completed step is a row of idem_steps, written
// by a statement that first checks that the run still has the owner's token. That check is the
// fence: a process that lost its lease (it was paused, or cut off, and another took the run over)
// cannot commit a step, and stops with [ErrLeaseLost]. River's own job completion does not fence
// a stale worker; the lease token does. Each failed attempt of a step is a row of
// idem_step_attempts (its error, number, time and outcome), so that [Engine.RunGet] shows every
// attempt, not only the last.
//
// # The start contract
//
// No workflow code runs for a key the call does not own. A run's first transaction opens when it
// starts: BEGIN, the key's in-flight lock (taken without waiting, as idem.Do takes it), the run's
// row and a read of the key, in one round trip. That read answers before the workflow function
// is called: a finished run's key replays its stored outcome; a run in flight is
// idem.ErrInFlight (or, with RunOpts.Wait, waited for); a key of another workflow, of idem.Do or
// of other input is idem.ErrMismatch; a run whose owner died is taken over, and its code runs
// once, from its history. The first Tx step runs in that same transaction (a failed attempt of it
// rolls the start back too, and the start is sent again with the attempt's record, which commits
// it); a Call, a wait or the run's end commits it first. So a run exists once its first step commits: a process that dies,
// or code that panics, before that leaves nothing, and the key is free again.
//
// Bookkeeping travels with the run's own transactions instead of adding some. A run has at most
// one open transaction at a time (the start's, or a Tx step's, held until the run's next step
// boundary so that the outcome commits with the last step); a Call's checkpoint waits for the
// next transaction that commits (or is written at once with StepOpts.CheckpointNow). A run of
// two Tx steps and a Call costs five round trips where the bare transactions cost six; a replay
// costs two. With a DB that is not a *pgxpool.Pool the same code begins its transactions with
// DB.Begin, in more round trips.
//
// A resumed run calls the workflow function from the top; each step finds its row and returns
// the stored output without running. A step that does not match the history at its position
// (the code changed under a run in progress) fails the run at once, as nondeterministic, saying
// where (see [NonDeterminismError]): no retry could make the code match.
//
// # Changing code under running runs
//
// Put a change to the steps of a workflow that has runs in progress behind [Patched]: a run that
// reaches the patch's point records a marker in its history and takes the new branch, and every
// later replay of it takes the same; a run that had passed the point before the patch takes the
// old one. [Deprecated] marks the point once no run that took the old branch is left, and goes
// when no run with the marker is. Every run records the code version that started it
// (Config.Version, RunRow.Version), which RunList filters on, and Config.ResumeVersions can leave
// the runs of other versions to engines of their own. Package workflowtest replays stored runs
// against new code before it is deployed, and tests workflows on this engine with a virtual
// clock.
//
// # A run's states
//
// A run is in one [RunState] at a time; this is every transition, and who makes it:
//
//	            Workflow.Run (this process owns it); StartTx, RunFork, StartChild (ownerless: a resume job)
//	                                  │ (a limited workflow's run whose key has no free slot: queued, until
//	                                  ▼  the end of an active run of its key starts it: WithConcurrency)
//	resume job, a Run call ─────► running ◄──────────────────────── wake job: the sleep is over, a signal
//	(lease expired: takeover)     │  │  │                               came, or the await timed out
//	                              │  │  └── steps.Sleep ──────► sleeping ──┤
//	                              │  └───── steps.Await, ─────► awaiting ──┘   (a child's end wakes
//	                              │         ChildRun.Wait                      its waiting parent)
//	                              │
//	    the workflow returns ─────┼──────────► done, failed
//	    the deadline passes ──────┼──────────► timed_out   (the owner at a step boundary, or the wake job)
//	    Engine.RunCancel ─────────┴──────────► cancelled   (also from sleeping, awaiting and queued)
//	    a parent's cancel or timeout ─────────► cancelled   (its children, unless ChildOpts.Abandon)
//	    reconcile hook (out of attempts, or unregistered): Complete → done, Fail → failed,
//	                                                       ResumeLater → running, ownerless
//	    Engine.RunResume: failed, cancelled, or running without a live lease → running, ownerless
//
// Only a running run has a lease; only a finished one (done, failed, cancelled, timed out)
// expires and is reaped; a waiting one has neither, and holds nothing until its job wakes it.
//
// # Recovery with River
//
// Recovery runs in the application's own River client (two River clients in one schema discard
// each other's jobs). [Engine.AddWorkers] adds four workers (the wake job of waiting runs is
// described below) and [Engine.PeriodicJobs] returns two periodic jobs:
//
//   - the scan finds runs whose lease expired, in batches, with FOR UPDATE SKIP LOCKED, and
//     inserts one resume job per run and expired lease (unique by its arguments). Every engine
//     whose workers run in the process scans by itself from SetClient on, waking when the next
//     live lease runs out (at most every ScanInterval), so recovery does not wait for River's
//     leader; the periodic scan job runs it too, on the leader;
//   - the resume job takes a new lease and continues the run from its last completed step, in
//     whatever process works it; a run out of attempts (Config.MaxAttempts), or whose workflow is
//     not registered anywhere after Config.UnregisteredGrace, goes to Config.Reconcile instead,
//     which resumes it later, completes it with a value or fails it (without a hook, it fails,
//     with a stored error that says why);
//   - the reaper (every Config.ReapInterval) deletes expired finished keys, of idem.Do and of
//     workflows, in bounded batches; running ones never.
//
// The River configuration this needs:
//
//   - Workers: the application's *river.Workers, after engine.AddWorkers(workers).
//
//   - PeriodicJobs: include engine.PeriodicJobs(). Periodic jobs run on River's elected leader,
//     so keep leader election enabled on at least one client that has the engine's workers.
//
//   - Queues: include Config.Queue (river.QueueDefault unless set), with enough MaxWorkers for
//     the runs that may be resumed at once: a resume job works as long as its workflow runs.
//
//   - JobTimeout: any; the resume worker sets its own timeout to none, since the lease, not
//     River, tells whether a run is alive. RescueStuckJobsAfter: any; a rescued resume job finds
//     the run's lease live and ends.
//
//   - engine.SetClient(client) once the client exists, for steps.Enqueue outside River workers
//     and for the engine's own recovery scan; engine.Close() stops that scan at shutdown.
//
//   - FetchCooldown and FetchPollInterval: River's defaults (100 ms, 1 s) bound how soon a job
//     inserted by StartTx, the scan or a signal starts; set them to 10 ms and 100 ms when runs
//     started with StartTx, or woken, should start at once (see below for runs that wait).
//
// # Waiting: sleep, signals, events, deadlines
//
// A run that waits (steps.Sleep, steps.Await) holds nothing while it waits: no lease, no
// goroutine, no connection, no River worker. Its wait step commits, in one transaction, the
// run's state (sleeping or awaiting), its wake-up time and the River job that wakes it then
// ([WakeArgs]); the caller of Run gets idem.ErrInFlight. [Engine.SignalTx] records a signal in
// the caller's transaction and inserts the wake job there too, so a signal exists if and only
// if that transaction commits. The woken run replays its history up to the wait and goes on.
// Stale wake jobs (the run was woken already, finished, cancelled) do nothing. Runs publish
// values with steps.SetEvent, read with [Engine.EventGet]. RunOpts.Timeout stores a deadline
// with the run; a run past it stops at its next step boundary, or is woken for it, and is
// stored as timed out ([ErrDeadlineExceeded]).
//
// # Telemetry
//
// Config.TracerProvider and Config.MeterProvider (default: OpenTelemetry's global providers)
// receive a span per call of Workflow.Run (idem.workflow.run), per resume job
// (idem.workflow.resume), per step (idem.workflow.step, replayed steps included, marked
// idem.replayed) and per scan; counters of step executions by outcome, step retries, resumes and
// reconciliations; a histogram of step duration; and a gauge of runs by state (done runs
// excepted). A run keeps the W3C traceparent of the span that started it, and its resume job
// makes that span its parent: the part of a run that another process finishes after a crash
// sits in the trace of the request that started it. Key IDs are never recorded, in spans, events,
// metrics, log records or the errors of the engine's River jobs: a run's records carry the hash
// of its key (idem.key.hash, key_hash) instead, and Config.RecordKeys the IDs; scopes and
// workflow names are recorded as they are.
//
// # Limits
//
// What callers and workflow code hand the engine is bounded by Config: a run's input
// (MaxInputBytes), a step's output (MaxStepOutputBytes) and a signal's payload
// (MaxSignalPayloadBytes), 1 MiB of JSON each by default, and the signals waiting in a run's
// mailbox (MaxPendingSignals, 10,000). Over a limit the answer is a *LimitError naming the limit
// and its field, and nothing of it is stored; a step whose output is over the limit fails for good
// at once.
//
// # Operating runs
//
// Runs can be read without running them ([Engine.RunGet], [Engine.RunList], and
// [Workflow.Get] for a typed outcome) and steered: [Engine.RunCancel] stops a run at its next
// checkpoint, [Engine.RunResume] continues a failed, cancelled or stuck one from its last
// completed step, and [Engine.RunFork] reruns a run from a step under a new key. None of them
// needs the workflow registered, so cmd/idem offers them to operators.
//
// # Attributes
//
// A run may carry string attributes for finding it: given at its start (RunOpts.Attributes,
// StartOpts.Attributes), changed by its Tx steps in their own transaction ([SetAttributesTx]), so
// that they change exactly once, with the step. [Engine.RunGet] shows them and
// RunListParams.Attributes filters on them, through a GIN index on idem_runs.attributes.
//
// # Schedules
//
// [Workflow.Schedule] defines a durable schedule: a row of idem_schedules that starts a run of
// the workflow at each tick of a cron expression (in a time zone) or of an interval. Every engine
// whose workers run fires the due schedules from the loop that scans for expired leases, not
// from River's leader: it takes a due schedule FOR UPDATE SKIP LOCKED and, in that transaction,
// starts each due tick's run ownerless (as StartTx does, with its resume job) under the key
// "sched/<name>/<tick>" and moves the schedule's next tick on, so a tick and its run commit
// together and no tick starts twice, however many engines run. The loop sleeps until the next
// tick is due, at most ScanInterval. Overlap policies say what a tick does while the run before
// it is unfinished ([OverlapSkip], [OverlapAllow]); catch-up policies which ticks missed during a
// downtime start afterwards ([CatchUpLatest], [CatchUpAll], [CatchUpSkip]). Operators pause,
// resume, trigger, backfill, list and delete schedules with the Engine's Schedule… methods or
// `idem schedules`, without the workflow registered. Cron expressions are parsed by
// github.com/robfig/cron/v3.
//
//	err := Settle.Schedule(ctx, engine, "nightly-settlement", SettleReq{}, &workflow.ScheduleOpts{
//		Cron:     "0 2 * * *",
//		TimeZone: "Europe/Berlin",
//		CatchUp:  workflow.CatchUpAll,
//	})
//
// Tables: idem.Migrate creates them (idem_keys, idem_runs, idem_steps, idem_step_attempts,
// idem_signals, idem_events and idem_schedules; see schema.sql), and River's own with
// rivermigrate. Step outputs, signal payloads and event values over 1 KiB live in
// idem_run_payloads, partitioned by the UTC day their run started; the reaper drops a day's
// partition once no run created on that day is left.
package workflow
