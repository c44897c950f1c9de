package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The web view's reads (package idemui, through workflow's RunCounts and RunActivity and the root
// package's KeyResult): runs counted by state, what RunGet leaves out of a run (its mailbox, its
// events and its trace), and a key's stored result.

// StateCount is how many runs are in one state. Estimated counts come from the planner's
// statistics, not from the rows.
type StateCount struct {
	State     RunState
	N         int64
	Estimated bool
}

// countedStates are the states counted through idem_runs_state, the partial index on every
// state but done; done runs, the bulk of the table, are what is left of the table's estimate.
var countedStates = []RunState{RunRunning, RunQueued, RunSleeping, RunAwaiting, RunFailed, RunCancelled, RunTimedOut}

// viewStatements are the texts of the view's statements, built once per schema.
type viewStatements struct {
	estimateAll, countAll, countIndexed, signals, events, trace, keyResult string
	estimateState                                                          map[RunState]string
}

var views sync.Map // *Statements -> *viewStatements

func (st *Statements) view() *viewStatements {
	if v, ok := views.Load(st); ok {
		return v.(*viewStatements)
	}
	t := st.Tables
	v := &viewStatements{
		estimateAll: t.render(`EXPLAIN (FORMAT JSON) SELECT FROM {runs}`),
		countAll:    t.render(`SELECT state, count(*) FROM {runs} GROUP BY state`),
		signals: t.render(`SELECT seq, name, payload, payload_day, coalesce(dedupe_id, ''), sent_at, consumed_at, consumed_step,
	count(*) OVER ()
FROM {signals} WHERE scope = $1 AND id = $2 ORDER BY seq DESC LIMIT $3`),
		events: t.render(`SELECT name, value, value_day, updated_at FROM {events} WHERE scope = $1 AND id = $2 ORDER BY name`),
		trace:  t.render(`SELECT coalesce(trace_context, '') FROM {runs} WHERE scope = $1 AND id = $2`),

		keyResult: t.render(`SELECT CASE WHEN k.result_day IS NULL THEN k.result ELSE ` + resultData(t, "k") + ` END,
	k.result_day IS NOT NULL, k.workflow FROM {keys} k WHERE k.scope = $1 AND k.id = $2`),

		estimateState: map[RunState]string{},
	}
	// One subquery per state, each with the state as a constant: a constant is what lets the
	// planner prove that state = 'failed' implies the partial index's state <> 'done', and each
	// count stops at its limit, so that a million failed runs cost what the limit does.
	parts := make([]string, 0, len(countedStates))
	for _, s := range countedStates {
		parts = append(parts, fmt.Sprintf(`(SELECT count(*) FROM (SELECT FROM {runs} WHERE state = '%s' LIMIT $1) AS %s)`, s, s))
		v.estimateState[s] = t.render(fmt.Sprintf(`EXPLAIN (FORMAT JSON) SELECT FROM {runs} WHERE state = '%s'`, s))
	}
	v.countIndexed = t.render(`SELECT ` + strings.Join(parts, ",\n\t"))
	actual, _ := views.LoadOrStore(st, v)
	return actual.(*viewStatements)
}

// RunStateCounts counts the runs in each state. When the planner estimates the table at no more
// than exactUpTo runs, every count is exact (one pass over a small table). Otherwise each state
// but done is counted through the partial index on state, exactly up to exactUpTo runs and
// estimated by the planner past that, and done is the table's estimate less the others,
// estimated too: no statement reads more than exactUpTo rows of one state, and none scans the
// table. States with no runs are left out; the order is the order of the states in a run's life.
func (st *Statements) RunStateCounts(ctx context.Context, q Querier, exactUpTo int) ([]StateCount, error) {
	if exactUpTo < 1 {
		return nil, errors.New("store: exactUpTo must be at least 1")
	}
	v := st.view()
	total, err := estimate(ctx, q, v.estimateAll)
	if err != nil {
		return nil, err
	}
	if total <= int64(exactUpTo) {
		rows, err := q.Query(ctx, v.countAll)
		if err != nil {
			return nil, err
		}
		byState := map[RunState]int64{}
		var (
			s RunState
			n int64
		)
		if _, err := pgx.ForEachRow(rows, []any{&s, &n}, func() error { byState[s] = n; return nil }); err != nil {
			return nil, err
		}
		return orderCounts(byState, nil), nil
	}
	counts := make([]int64, len(countedStates))
	dest := make([]any, len(counts))
	for i := range counts {
		dest[i] = &counts[i]
	}
	if err := q.QueryRow(ctx, v.countIndexed, exactUpTo).Scan(dest...); err != nil {
		return nil, err
	}
	byState := map[RunState]int64{}
	estimated := map[RunState]bool{RunDone: true}
	others := int64(0)
	for i, s := range countedStates {
		n := counts[i]
		if n >= int64(exactUpTo) {
			if n, err = estimate(ctx, q, v.estimateState[s]); err != nil {
				return nil, err
			}
			n = max(n, int64(exactUpTo))
			estimated[s] = true
		}
		byState[s] = n
		others += n
	}
	byState[RunDone] = max(total-others, 0)
	return orderCounts(byState, estimated), nil
}

// orderCounts lists the counts in the order of countedStates, done after running's kin, and
// any state this package does not know of last, by name.
func orderCounts(byState map[RunState]int64, estimated map[RunState]bool) []StateCount {
	order := append([]RunState{RunRunning, RunQueued, RunSleeping, RunAwaiting, RunDone}, countedStates[4:]...)
	out := make([]StateCount, 0, len(byState))
	for _, s := range order {
		if n := byState[s]; n > 0 {
			out = append(out, StateCount{State: s, N: n, Estimated: estimated[s]})
		}
		delete(byState, s)
	}
	rest := make([]string, 0, len(byState))
	for s := range byState {
		rest = append(rest, string(s))
	}
	slices.Sort(rest)
	for _, s := range rest {
		out = append(out, StateCount{State: RunState(s), N: byState[RunState(s)]})
	}
	return out
}

// estimate reads the planner's row estimate from an EXPLAIN (FORMAT JSON), which plans the
// statement and runs nothing.
func estimate(ctx context.Context, q Querier, explain string) (int64, error) {
	var plan []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	var text string
	if err := q.QueryRow(ctx, explain).Scan(&text); err != nil {
		return 0, err
	}
	if err := json.Unmarshal([]byte(text), &plan); err != nil || len(plan) != 1 {
		return 0, fmt.Errorf("store: unexpected EXPLAIN output %.100q", text)
	}
	return int64(plan[0].Plan.Rows), nil
}

// SignalRecord is a signal in a run's mailbox.
type SignalRecord struct {
	Seq          int64
	Name         string
	Payload      []byte
	DedupeID     string
	Sent         time.Time
	Consumed     *time.Time // nil while pending
	ConsumedStep *int       // the await step that consumed it
}

// RunSignals reads the newest limit signals of a run, oldest first, and how many it has in all.
func (st *Statements) RunSignals(ctx context.Context, q Querier, scope, id string, limit int) ([]SignalRecord, int, error) {
	rows, err := q.Query(ctx, st.view().signals, scope, id, limit)
	if err != nil {
		return nil, 0, err
	}
	var (
		out   []SignalRecord
		days  []*time.Time
		total int
	)
	for rows.Next() {
		var s SignalRecord
		var day *time.Time
		if err := rows.Scan(&s.Seq, &s.Name, &s.Payload, &day, &s.DedupeID, &s.Sent, &s.Consumed, &s.ConsumedStep, &total); err != nil {
			rows.Close()
			return nil, 0, err
		}
		out, days = append(out, s), append(days, day)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
		days[i], days[j] = days[j], days[i]
	}
	var refs []largeRef
	for i, day := range days {
		if day != nil && out[i].Payload == nil {
			refs = append(refs, largeRef{day: *day, ref: seqRef(out[i].Seq), dst: &out[i].Payload})
		}
	}
	if err := st.loadRunPayloads(ctx, q, scope, id, payloadSignal, refs); err != nil {
		return nil, 0, err
	}
	return out, total, nil
}

// EventRecord is a value a run published (steps.SetEvent): the last one of its name.
type EventRecord struct {
	Name    string
	Value   []byte
	Updated time.Time
}

// RunEvents reads a run's events by name, the large values from the run's partition of
// idem_run_payloads.
func (st *Statements) RunEvents(ctx context.Context, q Querier, scope, id string) ([]EventRecord, error) {
	rows, err := q.Query(ctx, st.view().events, scope, id)
	if err != nil {
		return nil, err
	}
	var days []*time.Time
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EventRecord, error) {
		var e EventRecord
		var day *time.Time
		err := r.Scan(&e.Name, &e.Value, &day, &e.Updated)
		days = append(days, day)
		return e, err
	})
	if err != nil {
		return nil, err
	}
	var refs []largeRef
	for i, day := range days {
		if day != nil && out[i].Value == nil {
			refs = append(refs, largeRef{day: *day, ref: out[i].Name, dst: &out[i].Value})
		}
	}
	if err := st.loadRunPayloads(ctx, q, scope, id, payloadEvent, refs); err != nil {
		return nil, err
	}
	return out, nil
}

// RunTraceContext reads the W3C traceparent a run keeps ("" for none); ok is false when there
// is no such run.
func (st *Statements) RunTraceContext(ctx context.Context, q Querier, scope, id string) (string, bool, error) {
	var tc string
	err := q.QueryRow(ctx, st.view().trace, scope, id).Scan(&tc)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return tc, err == nil, err
}

// KeyResult reads the result stored under a key: nil for a key without one (in flight for the
// first time, or a run's), with the workflow the key belongs to (nil for Do's); ok is false when
// there is no such key, or when its result was large and its partition is gone (a day after
// the key expired: see KeyLargeResult).
func (st *Statements) KeyResult(ctx context.Context, q Querier, scope, id string) (result []byte, workflow *string, ok bool, err error) {
	var large bool
	err = q.QueryRow(ctx, st.view().keyResult, scope, id).Scan(&result, &large, &workflow)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && large && result == nil) {
		return nil, nil, false, nil
	}
	return result, workflow, err == nil, err
}
