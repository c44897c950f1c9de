package workflow

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/tx"
)

// What an operator's view of runs reads beyond RunGet and RunList: runs counted by state, and a
// run's mailbox, events and trace. Package idemui shows them; like RunGet they have no side
// effect.

// DefaultExactCountUpTo is how many runs of one state [Engine.RunCounts] counts exactly before
// it estimates.
//
//	counts, err := engine.RunCounts(ctx, workflow.DefaultExactCountUpTo)
const DefaultExactCountUpTo = 10_000

// RunCount is how many runs are in one state; Estimated when it comes from the planner's
// statistics instead of the rows (see [Engine.RunCounts]).
//
//	for _, c := range counts {
//		fmt.Printf("%s %d (estimated: %t)\n", c.State, c.N, c.Estimated)
//	}
type RunCount struct {
	State     RunState `json:"state"`
	N         int64    `json:"n"`
	Estimated bool     `json:"estimated,omitempty"`
}

// RunCounts counts the runs in each state, cheaply at any size. On a table the planner
// estimates at no more than exactUpTo runs every count is exact. On a larger one each state but
// done is counted through the partial index on state (idem_runs_state), exactly up to
// exactUpTo and estimated past it, and done, the bulk of a long-lived table, is the table's
// estimate less the other states: Estimated says which. No statement reads more than exactUpTo
// index entries of a state, and none scans the table. States without runs are left out; the
// order is a run's life: running, queued, sleeping, awaiting, done, failed, cancelled, timed
// out. exactUpTo of 0 means DefaultExactCountUpTo.
//
//	counts, err := engine.RunCounts(ctx, 0)
func (e *Engine) RunCounts(ctx context.Context, exactUpTo int) ([]RunCount, error) {
	if exactUpTo < 0 {
		return nil, fmt.Errorf("workflow: exactUpTo cannot be negative (got %d)", exactUpTo)
	}
	if exactUpTo == 0 {
		exactUpTo = DefaultExactCountUpTo
	}
	counts, err := e.st.RunStateCounts(ctx, e.db, exactUpTo)
	if err != nil {
		return nil, fmt.Errorf("workflow: error counting runs: %w", e.tablesError(err))
	}
	out := make([]RunCount, 0, len(counts))
	for _, c := range counts {
		out = append(out, RunCount{State: RunState(c.State), N: c.N, Estimated: c.Estimated})
	}
	return out, nil
}

// MaxActivitySignals is how many of a run's signals [Engine.RunActivity] returns: the newest.
//
//	if act.SignalsTotal > workflow.MaxActivitySignals { ... } // some are left out
const MaxActivitySignals = 200

// SignalRow is a signal sent to a run (Engine.SignalTx), as [Engine.RunActivity] reads it.
//
//	for _, s := range act.Signals {
//		fmt.Println(s.Name, s.Sent, s.Consumed != nil)
//	}
type SignalRow struct {
	Seq      int64     `json:"seq"`
	Name     string    `json:"name"`
	Payload  []byte    `json:"payload,omitempty"` // as sent (JSON)
	DedupeID string    `json:"dedupe_id,omitempty"`
	Sent     time.Time `json:"sent"`

	// Consumed is when an await consumed it, and ConsumedStep that await's position in the run;
	// nil for a signal still pending in the mailbox.
	Consumed     *time.Time `json:"consumed,omitempty"`
	ConsumedStep *int       `json:"consumed_step,omitempty"`
}

// EventRow is a value a run published with steps.SetEvent: the last one of its name.
//
//	for _, ev := range act.Events {
//		fmt.Println(ev.Name, string(ev.Value))
//	}
type EventRow struct {
	Name    string    `json:"name"`
	Value   []byte    `json:"value,omitempty"` // JSON
	Updated time.Time `json:"updated"`
}

// RunActivity is what [Engine.RunGet] leaves out of a run: its mailbox, its events and the trace
// that started it.
//
//	act, err := engine.RunActivity(ctx, key)
type RunActivity struct {
	// Signals are the newest MaxActivitySignals signals sent to the run, oldest first;
	// SignalsTotal counts them all.
	Signals      []SignalRow `json:"signals,omitempty"`
	SignalsTotal int         `json:"signals_total"`

	Events []EventRow `json:"events,omitempty"` // by name

	// TraceParent is the W3C traceparent of the span that started the run, "" for none, and
	// TraceID its trace id (32 hex digits), "" when TraceParent is not one.
	TraceParent string `json:"trace_parent,omitempty"`
	TraceID     string `json:"trace_id,omitempty"`
}

// RunActivity reads the run under key's signals, events and trace context in one snapshot,
// without side effects, for runs of any workflow. No run under key is idem.ErrNotFound.
//
//	act, err := engine.RunActivity(ctx, idem.Key{Scope: "merchant:7", ID: "payout-1"})
//	for _, s := range act.Signals {
//		if s.Consumed == nil {
//			fmt.Println("pending:", s.Name)
//		}
//	}
func (e *Engine) RunActivity(ctx context.Context, key idem.Key) (*RunActivity, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	act := &RunActivity{}
	err := tx.Run(ctx, e.db, func(ctx context.Context, t pgx.Tx) error {
		*act = RunActivity{}
		tc, ok, err := e.st.RunTraceContext(ctx, t, key.Scope, key.ID)
		switch {
		case err != nil:
			return fmt.Errorf("workflow: error reading run: %w", e.tablesError(err))
		case !ok:
			return e.noRun(ctx, t, key)
		}
		act.TraceParent, act.TraceID = tc, traceID(tc)
		sigs, total, err := e.st.RunSignals(ctx, t, key.Scope, key.ID, MaxActivitySignals)
		if err != nil {
			return fmt.Errorf("workflow: error reading run's signals: %w", err)
		}
		act.SignalsTotal = total
		for _, s := range sigs {
			act.Signals = append(act.Signals, SignalRow{Seq: s.Seq, Name: s.Name, Payload: s.Payload, DedupeID: s.DedupeID, Sent: s.Sent,
				Consumed: s.Consumed, ConsumedStep: s.ConsumedStep})
		}
		evs, err := e.st.RunEvents(ctx, t, key.Scope, key.ID)
		if err != nil {
			return fmt.Errorf("workflow: error reading run's events: %w", err)
		}
		for _, ev := range evs {
			act.Events = append(act.Events, EventRow{Name: ev.Name, Value: ev.Value, Updated: ev.Updated})
		}
		return nil
	}, tx.Isolation(pgx.RepeatableRead), tx.ReadOnly())
	if err != nil {
		return nil, err
	}
	return act, nil
}

// traceID is the trace id of a W3C traceparent (version-traceid-parentid-flags), "" when tp is
// not one: read as a resume reads it (storedSpan), so that the view links the trace the run's
// spans joined.
func traceID(tp string) string {
	sc, ok := storedSpan(tp)
	if !ok {
		return ""
	}
	return sc.TraceID().String()
}
