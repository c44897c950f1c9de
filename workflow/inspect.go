package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/page"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/tx"
)

// RunState is the state of a run, as stored. A run is running until it finishes as done,
// failed, cancelled or timed out, and may wait (sleeping, awaiting a signal) in between; later
// versions may add states, so treat a state you do not know as "not finished" rather than as an
// error.
//
//	if run.State == workflow.RunStateFailed { ... }
type RunState string

// The states a run can be in today.
//
//	failed, err := engine.RunList(ctx, &workflow.RunListParams{States: []workflow.RunState{workflow.RunStateFailed}})
const (
	RunStateRunning   = RunState(store.RunRunning)
	RunStateSleeping  = RunState(store.RunSleeping)
	RunStateAwaiting  = RunState(store.RunAwaiting)
	RunStateDone      = RunState(store.RunDone)
	RunStateFailed    = RunState(store.RunFailed)
	RunStateCancelled = RunState(store.RunCancelled)
	RunStateTimedOut  = RunState(store.RunTimedOut)
	RunStateQueued    = RunState(store.RunQueued) // waits for a slot of its concurrency key
)

// Finished reports whether s is a final state: done, failed, cancelled or timed out.
//
//	if !run.State.Finished() { ... } // still working, or waiting
func (s RunState) Finished() bool { return store.RunState(s).Finished() }

// RunRow is a run as stored, for operators: what [Engine.RunGet] and [Engine.RunList] return.
// Reading it has no side effect.
//
//	run, err := engine.RunGet(ctx, key)
//	fmt.Printf("%s %s: %s after %d attempts, %d steps\n", run.Workflow, run.ID, run.State, run.Attempts, len(run.Steps))
type RunRow struct {
	Scope    string   `json:"scope"`
	ID       string   `json:"id"`
	Workflow string   `json:"workflow"`
	State    RunState `json:"state"`

	// Attempts counts how many times the run was started or taken over since its budget was
	// last renewed (a resume renews it).
	Attempts int `json:"attempts"`

	// LeaseOwner names the process that holds the run ("host:pid"), and LeaseExpires when its
	// lease runs out; "" and nil when no one holds it (a finished run, a waiting one, or one
	// waiting for a resume job). A lease in the past means the owner is gone and the run will
	// be resumed. A run cancelled under an owner shows that owner's lease until it stops.
	LeaseOwner   string     `json:"lease_owner,omitempty"`
	LeaseExpires *time.Time `json:"lease_expires,omitempty"`

	// For a sleeping or awaiting run: WakeAt is when it wakes (a sleep's end, an await's
	// timeout; nil for an await without one), and AwaitingSignal the signal it waits for.
	WakeAt         *time.Time `json:"wake_at,omitempty"`
	AwaitingSignal string     `json:"awaiting_signal,omitempty"`

	// Deadline is when the run times out (RunOpts.Timeout), nil without one.
	Deadline *time.Time `json:"deadline,omitempty"`

	// PendingSignals counts the signals in the run's mailbox that no await has consumed yet.
	PendingSignals int `json:"pending_signals,omitempty"`

	// Attributes are the run's attributes (RunOpts.Attributes, SetAttributesTx); nil for none.
	Attributes map[string]string `json:"attributes,omitempty"`

	// Version is the code version (Config.Version) of the engine that started the run, and
	// AttemptVersion that of the engine that holds it now, or held it last (its start, a
	// takeover, a wake-up); "" for what was stored before versions were recorded.
	Version        string `json:"version,omitempty"`
	AttemptVersion string `json:"attempt_version,omitempty"`

	// LastError is why the last attempt stopped without an outcome (a panic, a lost database),
	// when known.
	LastError string `json:"last_error,omitempty"`

	// Reason says why the engine, rather than the workflow's code, failed the run:
	// FailureNondeterministic when its code diverged from its history, with Divergence saying
	// where (Error says what to do). "" otherwise.
	Reason     FailureReason `json:"reason,omitempty"`
	Divergence *Divergence   `json:"divergence,omitempty"`

	// Input is the run's input as JSON. Output is the output as JSON when done, and
	// {"error": "..."} when failed, cancelled or timed out; Error is that message.
	Input  json.RawMessage `json:"input,omitempty"`
	Output json.RawMessage `json:"output,omitempty"`
	Error  string          `json:"error,omitempty"`

	Created  time.Time  `json:"created"`
	Updated  time.Time  `json:"updated"`
	Finished *time.Time `json:"finished,omitempty"`
	Expires  *time.Time `json:"expires,omitempty"` // when a finished run is reaped

	// Steps are the run's completed steps in order; filled by RunGet only.
	Steps []StepRow `json:"steps,omitempty"`

	// Failures are the step attempts that failed, oldest first: the newest
	// Config.StepAttemptsKept of each step, whether the step then completed, is being retried,
	// or failed for good; filled by RunGet only.
	Failures []AttemptRow `json:"failures,omitempty"`

	// Parent is the run whose step started this one, for a child run (see Workflow.StartChild),
	// with the step's position; nil otherwise.
	Parent *ParentRef `json:"parent,omitempty"`

	// Children are the runs this run's steps started, in order; filled by RunGet only.
	Children []ChildRow `json:"children,omitempty"`

	// ForkedFrom is the run this one was forked from (Engine.RunFork) and how many of its steps
	// were copied: the first ForkedFrom.Steps steps of this run are replayed copies, not run
	// here. Nil for a run that was not forked. The original is named by its key, and may have been
	// reaped since.
	ForkedFrom *ForkRef `json:"forked_from,omitempty"`
}

// ForkRef names the run a forked run copied, and how many of its steps it copied (fromStep - 1
// of Engine.RunFork).
//
//	if f := run.ForkedFrom; f != nil {
//		fmt.Printf("forked from %s after its step %d\n", f.Key.ID, f.Steps)
//	}
type ForkRef struct {
	Key   idem.Key `json:"key"`
	Steps int      `json:"steps"`
}

// ParentRef names a child run's parent and the step of the parent that started it.
//
//	if run.Parent != nil {
//		parent, err := engine.RunGet(ctx, run.Parent.Key)
//	}
type ParentRef struct {
	Key idem.Key `json:"key"`
	Seq int      `json:"seq"`
}

// ChildRow is a run's child, as [Engine.RunGet] lists it.
//
//	for _, c := range run.Children {
//		fmt.Printf("#%d %s %s: %s\n", c.Seq, c.Workflow, c.Key.ID, c.State)
//	}
type ChildRow struct {
	Key      idem.Key  `json:"key"`
	Workflow string    `json:"workflow"`
	State    RunState  `json:"state"`
	Seq      int       `json:"seq"` // the parent's step that started it
	Created  time.Time `json:"created"`
}

// AttemptOutcome says how a failed attempt of a step ended.
//
//	if a.Outcome == workflow.AttemptRetried { ... }
type AttemptOutcome string

// How a failed attempt ended: it was retried; it was the last one, and the step failed for good
// after it; its error was marked permanent (steps.Permanent), so it was not retried; or the run
// stopped during it (a lost connection or lease, a shutdown), so the step runs again when the
// run resumes.
//
//	failedForGood := a.Outcome == workflow.AttemptFailed || a.Outcome == workflow.AttemptPermanent
const (
	AttemptRetried   = AttemptOutcome(store.AttemptRetried)
	AttemptFailed    = AttemptOutcome(store.AttemptFailed)
	AttemptPermanent = AttemptOutcome(store.AttemptPermanent)
	AttemptStopped   = AttemptOutcome(store.AttemptStopped)
)

// AttemptRow is a failed attempt of a step, as [Engine.RunGet] reads it.
//
//	for _, a := range run.Failures {
//		fmt.Printf("#%d %s attempt %d (%s) at %s: %s\n", a.Seq, a.Step, a.Attempt, a.Outcome, a.At, a.Error)
//	}
type AttemptRow struct {
	Seq     int            `json:"seq"` // the step's position in the run
	Step    string         `json:"step"`
	Kind    string         `json:"kind"`
	Attempt int            `json:"attempt"` // within the process that ran it, from 1
	Outcome AttemptOutcome `json:"outcome"`
	Error   string         `json:"error"` // clipped to 2 KiB
	At      time.Time      `json:"at"`
	Version string         `json:"version,omitempty"` // the code version it ran on (Config.Version)
}

// StepRow is one completed step of a run, as stored in its history.
//
//	for _, s := range run.Steps {
//		fmt.Printf("#%d %s:%s %s\n", s.Seq, s.Kind, s.Name, s.Output)
//	}
type StepRow struct {
	Seq      int             `json:"seq"` // position in the run, from 1
	Name     string          `json:"name"`
	Kind     string          `json:"kind"` // "tx", "call", "enqueue", ...
	Attempts int             `json:"attempts"`
	Output   json.RawMessage `json:"output,omitempty"` // the step's output as JSON
	Error    string          `json:"error,omitempty"`  // set instead when the step failed for good
	Failed   bool            `json:"failed,omitempty"` // the step failed for good (with Error as its message)
	Created  time.Time       `json:"created"`          // when its checkpoint was written
}

// runRow makes a RunRow of a run as stored.
func runRow(r *store.RunRecord) *RunRow {
	run := &RunRow{Scope: r.Scope, ID: r.ID, Workflow: r.Workflow, State: RunState(r.State), Attempts: r.Attempts, LeaseOwner: r.LeaseOwner,
		LeaseExpires: r.LeaseExpires, WakeAt: r.WakeAt, AwaitingSignal: r.AwaitingSignal, Deadline: r.Deadline,
		PendingSignals: r.PendingSignals, LastError: r.LastError, Input: rawJSON(r.Input), Output: rawJSON(r.Output),
		Created: r.Created, Updated: r.Updated, Finished: r.Finished, Expires: r.Expires, Attributes: r.Attributes,
		Version: r.Version, AttemptVersion: r.AttemptVersion}
	if run.State.Finished() && run.State != RunStateDone {
		var f storedFailure
		if json.Unmarshal(r.Output, &f) == nil {
			run.Error, run.Reason, run.Divergence = f.Error, f.Reason, f.Divergence
		}
	}
	if r.ForkedScope != nil && r.ForkedID != nil && r.ForkedSteps != nil {
		run.ForkedFrom = &ForkRef{Key: idem.Key{Scope: *r.ForkedScope, ID: *r.ForkedID}, Steps: *r.ForkedSteps}
	}
	if r.ParentScope != nil && r.ParentID != nil {
		run.Parent = &ParentRef{Key: idem.Key{Scope: *r.ParentScope, ID: *r.ParentID}}
		if r.ParentSeq != nil {
			run.Parent.Seq = *r.ParentSeq
		}
	}
	return run
}

// rawJSON keeps stored JSON as it is, and makes anything else (there should be nothing else) a
// JSON string, so that a RunRow always encodes.
func rawJSON(b []byte) json.RawMessage {
	if b == nil {
		return nil
	}
	if json.Valid(b) {
		return b
	}
	s, _ := json.Marshal(string(b))
	return s
}

// RunGet reads the run under key with its steps, in one snapshot and without side effects: no
// lock, no lease, no River. It works for runs of any workflow, registered with this engine or
// not. A key with no run (never used, reaped, or a key of idem.Do's) is idem.ErrNotFound.
//
//	run, err := engine.RunGet(ctx, idem.Key{Scope: "merchant:7", ID: "payout-1"})
//	if errors.Is(err, idem.ErrNotFound) { ... }
//	if run.State == workflow.RunStateFailed {
//		log.Printf("failed at step %d: %s", len(run.Steps), run.Error)
//	}
func (e *Engine) RunGet(ctx context.Context, key idem.Key) (*RunRow, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	var run *RunRow
	// One snapshot for the run and its steps, so that they agree; tx.Run sends BEGIN, with the
	// isolation level in it, together with the first query.
	err := tx.Run(ctx, e.db, func(ctx context.Context, t pgx.Tx) error {
		r, ok, err := e.st.RunGet(ctx, t, key.Scope, key.ID)
		switch {
		case err != nil:
			return fmt.Errorf("workflow: error reading run: %w", e.tablesError(err))
		case !ok:
			return e.noRun(ctx, t, key)
		}
		run = runRow(r)
		steps, err := e.st.RunSteps(ctx, t, key.Scope, key.ID)
		if err != nil {
			return fmt.Errorf("workflow: error reading run's steps: %w", err)
		}
		run.Steps = make([]StepRow, 0, len(steps))
		for _, s := range steps {
			row := StepRow{Seq: s.Seq, Name: s.Name, Kind: s.Kind, Attempts: s.Attempts, Output: rawJSON(s.Output), Created: s.Created}
			if s.Error != nil {
				row.Error, row.Failed = *s.Error, true
			}
			run.Steps = append(run.Steps, row)
		}
		attempts, err := e.st.RunAttempts(ctx, t, key.Scope, key.ID)
		if err != nil {
			return fmt.Errorf("workflow: error reading run's failed attempts: %w", err)
		}
		for _, a := range attempts {
			run.Failures = append(run.Failures, AttemptRow{Seq: a.Seq, Step: a.Name, Kind: a.Kind, Attempt: a.Attempt,
				Outcome: AttemptOutcome(a.Outcome), Error: a.Error, At: a.At, Version: a.Version})
		}
		children, err := e.st.RunChildren(ctx, t, key.Scope, key.ID)
		if err != nil {
			return fmt.Errorf("workflow: error reading run's children: %w", err)
		}
		for _, c := range children {
			run.Children = append(run.Children, ChildRow{Key: idem.Key{Scope: c.Scope, ID: c.ID}, Workflow: c.Workflow, State: RunState(c.State),
				Seq: c.Seq, Created: c.Created})
		}
		return nil
	}, tx.Isolation(pgx.RepeatableRead), tx.ReadOnly())
	if err != nil {
		return nil, err
	}
	return run, nil
}

// noRun explains a key that has no run: never stored, or a key of idem.Do's.
func (e *Engine) noRun(ctx context.Context, q store.Querier, key idem.Key) error {
	workflow, found, err := e.st.KeyWorkflow(ctx, q, key.Scope, key.ID)
	switch {
	case err != nil:
		return fmt.Errorf("workflow: error reading key: %w", err)
	case found && workflow == nil:
		return fmt.Errorf("%w: key %q in scope %q belongs to idem.Do, not to a run (see idem.KeyGet)", idem.ErrNotFound, key.ID, key.Scope)
	}
	return runNotFound(key)
}

func runNotFound(key idem.Key) error {
	return fmt.Errorf("%w: no run has key %q in scope %q", idem.ErrNotFound, key.ID, key.Scope)
}

// Page sizes of [Engine.RunList]: RunListParams.Limit 0 means DefaultRunListLimit, and a Limit
// over MaxRunListLimit is refused.
//
//	res, err := engine.RunList(ctx, &workflow.RunListParams{Limit: workflow.MaxRunListLimit})
const (
	DefaultRunListLimit = 100
	MaxRunListLimit     = 1000
)

// RunListParams filter and page [Engine.RunList]. nil, and every zero field, select everything.
//
//	params := &workflow.RunListParams{States: []workflow.RunState{workflow.RunStateFailed}, Limit: 50}
type RunListParams struct {
	States    []RunState // any of these states
	Workflows []string   // any of these workflows
	Versions  []string   // started by any of these code versions (Config.Version)
	Scope     string     // this scope only
	Parent    *idem.Key  // the children of this run only

	// Since and Until bound when the run was created: at or after Since, before Until.
	Since, Until time.Time

	// Attributes select runs that have each of these attributes, key and value (through the
	// index on them, idem_runs_attributes).
	Attributes map[string]string

	// Limit is the page size: default 100, at most 1000.
	Limit int

	// After is the cursor of the page before (RunListResult.Next): this page starts after it.
	After string
}

// RunListResult is a page of runs, newest first.
//
//	for page := (&workflow.RunListParams{}); ; {
//		res, err := engine.RunList(ctx, page)
//		...
//		if res.Next == "" { break }
//		page.After = res.Next
//	}
type RunListResult struct {
	Runs []*RunRow `json:"runs"`
	// Next is the cursor of the next page, "" when this page is the last.
	Next string `json:"next,omitempty"`
}

// RunList lists runs, newest first, without side effects: Steps are left empty (see RunGet).
// The cursor is the last run's (created, scope, id), which orders runs totally, so paging on
// with RunListResult.Next neither repeats nor skips a run, however many are added meanwhile
// (new runs are newer, and come before the first page). A Limit over 1000, a negative one, or a
// cursor that is not one of RunList's is refused.
//
//	res, err := engine.RunList(ctx, &workflow.RunListParams{
//		States:    []workflow.RunState{workflow.RunStateFailed, workflow.RunStateCancelled},
//		Workflows: []string{"payout"},
//		Since:     time.Now().Add(-24 * time.Hour),
//	})
//	for _, run := range res.Runs {
//		fmt.Println(run.ID, run.State, run.Error)
//	}
func (e *Engine) RunList(ctx context.Context, params *RunListParams) (*RunListResult, error) {
	if params == nil {
		params = &RunListParams{}
	}
	f := store.RunFilter{Scope: params.Scope, Workflows: params.Workflows, Limit: params.Limit, Attributes: params.Attributes,
		Versions: params.Versions}
	if err := validateAttributes("RunListParams.Attributes", params.Attributes, false); err != nil {
		return nil, err
	}
	limit, err := pageLimit("RunListParams.Limit", params.Limit)
	if err != nil {
		return nil, err
	}
	for _, s := range params.States {
		f.States = append(f.States, string(s))
	}
	if params.Parent != nil {
		if err := params.Parent.Validate(); err != nil {
			return nil, fmt.Errorf("workflow: RunListParams.Parent: %w", err)
		}
		f.Parent = &store.RunKey{Scope: params.Parent.Scope, ID: params.Parent.ID}
	}
	if !params.Since.IsZero() {
		f.Since = &params.Since
	}
	if !params.Until.IsZero() {
		f.Until = &params.Until
	}
	if params.After != "" {
		c, err := decodeCursor(params.After)
		if err != nil {
			return nil, err
		}
		f.After = c
	}
	f.Limit = limit + 1
	records, err := e.st.RunList(ctx, e.db, f)
	if err != nil {
		return nil, fmt.Errorf("workflow: error listing runs: %w", e.tablesError(err))
	}
	res := &RunListResult{Runs: make([]*RunRow, 0, len(records))}
	for _, r := range records {
		res.Runs = append(res.Runs, runRow(r))
	}
	if len(res.Runs) > limit {
		// One row more than the page was asked for, so that Next is "" on the last page.
		res.Runs = res.Runs[:limit]
		last := store.RunCursor{Created: res.Runs[limit-1].Created.UnixMicro(), Scope: res.Runs[limit-1].Scope, ID: res.Runs[limit-1].ID}
		res.Next = encodeCursor(last)
	}
	return res, nil
}

// pageLimit checks the Limit of a page of RunList or ScheduleList (field names it), and gives
// the default for 0.
func pageLimit(field string, limit int) (int, error) {
	return page.Limit("workflow: "+field, limit, DefaultRunListLimit, MaxRunListLimit)
}

type cursor struct {
	Created int64  `json:"c"`
	Scope   string `json:"s"`
	ID      string `json:"i"`
}

func encodeCursor(c store.RunCursor) string {
	return page.Encode(cursor{Created: c.Created, Scope: c.Scope, ID: c.ID})
}

// ErrInvalidCursor is RunList's answer to a RunListParams.After that is not a cursor it made.
//
//	if errors.Is(err, workflow.ErrInvalidCursor) { // start from the first page
//	}
var ErrInvalidCursor = errors.New("workflow: invalid RunList cursor")

func decodeCursor(s string) (*store.RunCursor, error) {
	// The creation times a cursor may carry, in µs since the epoch: years 1 to 9999, well inside
	// what Postgres's timestamptz and its interval arithmetic hold.
	const minCreated, maxCreated = -62135596800000000, 253402300799999999
	// A cursor RunList made holds a run's key, which passed idem's checks when it was stored, and
	// its creation time, which Postgres held: anything else was forged, and would reach the
	// statement as a value Postgres refuses (a NUL byte, invalid UTF-8, a time out of range).
	var c cursor
	if !page.Decode(s, &c) || (idem.Key{Scope: c.Scope, ID: c.ID}).Validate() != nil || c.Created < minCreated || c.Created > maxCreated {
		return nil, fmt.Errorf("%w: RunListParams.After %s is not a cursor from RunListResult.Next", ErrInvalidCursor, page.Quote(s))
	}
	return &store.RunCursor{Created: c.Created, Scope: c.Scope, ID: c.ID}, nil
}
