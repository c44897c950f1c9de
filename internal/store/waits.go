package store

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// waitStatements are the texts of the statements for waiting runs (sleep, await), signals,
// events and deadlines.
type waitStatements struct {
	lock, consume, suspend, inspect, wake, timeOut, signal, overdue, setEvent, getEvent string

	// The same writes for a payload or value over PayloadInlineMax, which goes to
	// idem_run_payloads.
	signalLarge, setEventLarge string
}

// signalSQL is the statement that records a signal; a large payload goes to the partition of
// its run's start day, named by the created_at of the run's row, which it reads anyway.
func signalSQL(t Tables, large bool) string {
	day, payload, stored := ``, `$4`, ``
	if large {
		day = `,
		` + t.runPayloadDay("created_at") + ` AS day`
		payload = `CASE WHEN run.day IS NULL THEN $4::bytea END, run.day`
		stored = `, stored AS (
	` + t.runPayloadStore(payloadSignal, "payload_day", "$1", "$2", "seq::text", "$4", "sig") + `
)`
	}
	cols, returning := `payload`, `seq`
	if large {
		cols, returning = `payload, payload_day`, `seq, payload_day`
	}
	return t.render(`WITH run AS (
	SELECT state, wait_name, wait_seq, (extract(epoch FROM created_at) * 1000000)::int8 AS created,
		(extract(epoch FROM updated_at) * 1000000)::int8 AS suspended` + day + `
	FROM {runs} WHERE scope = $1 AND id = $2
	FOR KEY SHARE
), pending AS (
	SELECT count(*) AS n FROM {signals} WHERE scope = $1 AND id = $2 AND consumed_at IS NULL
), sig AS (
	INSERT INTO {signals} (scope, id, name, ` + cols + `, dedupe_id)
	SELECT $1, $2, $3, ` + payload + `, $5 FROM run, pending WHERE run.state NOT IN ('done', 'failed', 'cancelled', 'timed_out') AND pending.n < $6
	ON CONFLICT (scope, id, dedupe_id) WHERE dedupe_id IS NOT NULL DO NOTHING
	RETURNING ` + returning + `
)` + stored + `
SELECT run.state, run.state = 'awaiting' AND run.wait_name IS NOT DISTINCT FROM $3, coalesce(run.wait_seq, 0), run.created,
	(SELECT seq FROM sig), run.suspended, (SELECT n FROM pending)::int4,
	$5::text IS NOT NULL AND EXISTS (SELECT FROM {signals} WHERE scope = $1 AND id = $2 AND dedupe_id = $5)
FROM run`)
}

func newWaitStatements(t Tables) waitStatements {
	return waitStatements{
		// FOR UPDATE conflicts with signal's FOR KEY SHARE, so a signal being sent and a run
		// about to wait are ordered: whichever locks second sees the other's commit, and a signal
		// is never missed between the mailbox check and the suspension. Lease renewals and
		// checkpoints take weaker locks and do not wait for signals.
		lock: t.render(`SELECT (extract(epoch FROM {now}) * 1000000)::int8, (extract(epoch FROM deadline) * 1000000)::int8,
	wait_seq, wait_name, (extract(epoch FROM wake_at) * 1000000)::int8
FROM {runs} WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'
FOR UPDATE`),

		consume: t.render(`UPDATE {signals} SET consumed_at = {now}, consumed_step = $4
WHERE scope = $1 AND id = $2 AND consumed_at IS NULL AND seq = (
	SELECT seq FROM {signals} WHERE scope = $1 AND id = $2 AND name = $3 AND consumed_at IS NULL ORDER BY seq LIMIT 1
)
RETURNING seq, payload, payload_day`),

		suspend: t.render(`UPDATE {runs} SET state = $4, wait_seq = $5, wait_name = $6,
	wake_at = 'epoch'::timestamptz + $7::int8 @us, lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
	last_error = NULL, attempts = 0, updated_at = {now}
WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`),

		inspect: t.render(`SELECT state, workflow, (extract(epoch FROM created_at) * 1000000)::int8, coalesce(wait_seq, 0),
	coalesce(deadline <= {now}, false), coalesce(version, '')
FROM {runs} WHERE scope = $1 AND id = $2`),

		wake: t.render(`UPDATE {runs} SET state = 'running', lease_token = $5, lease_owner = $6,
	lease_expires_at = {now} + $7::int8 @us, attempts = attempts + 1, attempt_version = $8, updated_at = {now}
WHERE scope = $1 AND id = $2 AND state IN ('sleeping', 'awaiting')
	AND (extract(epoch FROM created_at) * 1000000)::int8 = $3 AND ($4::int4 = 0 OR wait_seq = $4)
` + claimReturning),

		timeOut: t.render(`UPDATE {runs} SET state = 'timed_out', output = $4, lease_token = NULL, lease_owner = NULL,
	lease_expires_at = NULL, last_error = NULL, updated_at = {now}, finished_at = {now}, expires_at = {now} + $5::int8 @us
WHERE scope = $1 AND id = $2 AND state IN ('sleeping', 'awaiting')
	AND (extract(epoch FROM created_at) * 1000000)::int8 = $3 AND deadline <= {now}`),

		signal:      signalSQL(t, false),
		signalLarge: signalSQL(t, true),

		overdue: t.render(`SELECT scope, id, (extract(epoch FROM created_at) * 1000000)::int8, coalesce(wait_seq, 0)
FROM {runs} WHERE state IN ('sleeping', 'awaiting') AND least(wake_at, deadline) <= {now} - $2::int8 @us
ORDER BY least(wake_at, deadline) LIMIT $1`),

		// value_day goes back to NULL when a small value replaces a large one.
		setEvent: t.render(`INSERT INTO {events} (scope, id, name, value) VALUES ($1, $2, $3, $4)
ON CONFLICT (scope, id, name) DO UPDATE SET value = excluded.value, value_day = NULL, updated_at = {now}`),

		// The run's creation comes from the engine ($5), which keeps it.
		setEventLarge: t.render(`WITH p AS (
	SELECT ` + t.runPayloadDay(createdAt("$5")) + ` AS day
), stored AS (
	` + t.runPayloadStore(payloadEvent, "day", "$1", "$2", "$3", "$4", "p") + `
)
INSERT INTO {events} (scope, id, name, value, value_day) SELECT $1, $2, $3, CASE WHEN p.day IS NULL THEN $4::bytea END, p.day FROM p
ON CONFLICT (scope, id, name) DO UPDATE SET value = excluded.value, value_day = excluded.value_day, updated_at = {now}`),

		getEvent: t.render(`SELECT r.state, e.name IS NOT NULL, e.value, e.value_day
FROM {runs} r LEFT JOIN {events} e ON e.scope = r.scope AND e.id = r.id AND e.name = $3
WHERE r.scope = $1 AND r.id = $2`),
	}
}

// WaitRow is a run as a wait step's transaction locked it.
type WaitRow struct {
	Now      int64   // Postgres's clock, µs
	Deadline *int64  // µs
	Seq      *int    // the step that waited last,
	Name     *string // for which signal (an await),
	WakeAt   *int64  // until when, µs
}

// WaitLock locks the run's row FOR UPDATE if the caller holds its lease, at the start of a wait
// step's transaction: the fence of everything the step writes. ok is false when the caller no
// longer holds the lease.
func (st *Statements) WaitLock(ctx context.Context, q Querier, p LeaseParams) (WaitRow, bool, error) {
	var w WaitRow
	err := q.QueryRow(ctx, st.waits.lock, p.Scope, p.ID, p.Token).Scan(&w.Now, &w.Deadline, &w.Seq, &w.Name, &w.WakeAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return WaitRow{}, false, nil
	}
	return w, err == nil, err
}

// SignalConsumed is the signal an await took from the mailbox.
type SignalConsumed struct {
	Seq     int64
	Payload []byte
}

// SignalConsume marks the oldest pending signal of name as consumed by the step at seq. ok is
// false when there is none. A large payload is read from its partition of idem_run_payloads, in
// one more query.
func (st *Statements) SignalConsume(ctx context.Context, q Querier, scope, id, name string, seq int) (SignalConsumed, bool, error) {
	var s SignalConsumed
	var day *time.Time
	err := q.QueryRow(ctx, st.waits.consume, scope, id, name, seq).Scan(&s.Seq, &s.Payload, &day)
	if errors.Is(err, pgx.ErrNoRows) {
		return SignalConsumed{}, false, nil
	}
	if err == nil && day != nil && s.Payload == nil {
		err = st.loadRunPayloads(ctx, q, scope, id, payloadSignal, []largeRef{{day: *day, ref: seqRef(s.Seq), dst: &s.Payload}})
	}
	return s, err == nil, err
}

// SuspendParams leave a run waiting at step Seq: sleeping, or awaiting Signal, until WakeAt (µs;
// nil for an await without a timeout).
type SuspendParams struct {
	LeaseParams
	State  RunState
	Seq    int
	Signal *string
	WakeAt *int64
}

// RunSuspend gives up the lease and leaves the run waiting. ok is false when the caller no longer
// holds the lease.
func (st *Statements) RunSuspend(ctx context.Context, q Querier, p SuspendParams) (bool, error) {
	tag, err := q.Exec(ctx, st.waits.suspend, p.Scope, p.ID, p.Token, string(p.State), p.Seq, p.Signal, p.WakeAt)
	return tag.RowsAffected() == 1, err
}

// WaitInspected is a waiting run as its wake-up job reads it.
type WaitInspected struct {
	State    RunState
	Workflow string
	Created  int64 // µs: the run's generation
	Seq      int   // the waiting step, 0 for none
	Overdue  bool  // its deadline has passed
	Version  string
}

// WaitInspect reads a run for its wake-up job. ok is false when there is none.
func (st *Statements) WaitInspect(ctx context.Context, q Querier, scope, id string) (WaitInspected, bool, error) {
	var w WaitInspected
	err := q.QueryRow(ctx, st.waits.inspect, scope, id).Scan(&w.State, &w.Workflow, &w.Created, &w.Seq, &w.Overdue, &w.Version)
	if errors.Is(err, pgx.ErrNoRows) {
		return WaitInspected{}, false, nil
	}
	return w, err == nil, err
}

// WakeParams take a waiting run with a new lease, if it still waits at step Seq (any step when 0)
// of generation Generation.
type WakeParams struct {
	LeaseParams
	Generation int64
	Seq        int
	Owner      string
	Lease      time.Duration
	Version    string // the code version of the waker, which the run's attempt_version becomes
}

// RunWake takes a waiting run with the caller's lease. ok is false when it no longer waits where
// the caller was told (another job woke it first, it finished, it was cancelled).
func (st *Statements) RunWake(ctx context.Context, q Querier, p WakeParams) (Claim, bool, error) {
	return scanClaim(q.QueryRow(ctx, st.waits.wake, p.Scope, p.ID, p.Generation, p.Seq, p.Token, p.Owner, micros(p.Lease), p.Version))
}

// RunTimeOut finishes a waiting run of generation created whose deadline has passed as timed
// out, without waking it. ended is false when it was not such a run by then.
func (st *Statements) RunTimeOut(ctx context.Context, q Querier, scope, id string, created int64, output []byte, ttl time.Duration) (ended bool, err error) {
	tag, err := q.Exec(ctx, st.waits.timeOut, scope, id, created, output, micros(ttl))
	return tag.RowsAffected() == 1, err
}

// SignalParams are a signal sent to a run; DedupeID "" for none. It is recorded only while the
// run has fewer than MaxPending signals pending (0: no bound).
type SignalParams struct {
	Scope, ID, Name string
	Payload         []byte
	DedupeID        string
	MaxPending      int
}

// SignalRow is what SignalSend found and did.
type SignalRow struct {
	State     RunState
	Awaits    bool   // the run awaits this signal now
	WaitSeq   int    // the step it waits at
	Created   int64  // µs
	Seq       *int64 // the signal's position; nil for a duplicate, or a refused signal
	Suspended int64  // µs: while the run waits, when its wait began
	Pending   int    // the run's signals pending before this one
	Duplicate bool   // a signal with the same dedupe id was recorded before
}

// SignalSend records a signal in the caller's transaction, unless the run is finished, the
// dedupe id was seen before or the run has MaxPending signals pending, locking the run FOR KEY
// SHARE (see WaitLock); concurrent senders are not ordered by that lock, so each of them may find
// room for one more. ok is false when the run is unknown. A payload over PayloadInlineMax bytes
// goes to the partition of idem_run_payloads for the day the run was created, in the same
// statement, when that partition exists.
func (st *Statements) SignalSend(ctx context.Context, q Querier, p SignalParams) (SignalRow, bool, error) {
	var s SignalRow
	most := p.MaxPending
	if most <= 0 {
		most = math.MaxInt32
	}
	sql := st.waits.signal
	if large(len(p.Payload)) {
		sql = st.waits.signalLarge
	}
	err := q.QueryRow(ctx, sql, p.Scope, p.ID, p.Name, p.Payload, nullText(p.DedupeID), most).Scan(&s.State, &s.Awaits,
		&s.WaitSeq, &s.Created, &s.Seq, &s.Suspended, &s.Pending, &s.Duplicate)
	if errors.Is(err, pgx.ErrNoRows) {
		return SignalRow{}, false, nil
	}
	return s, err == nil, err
}

// OverdueRow is a waiting run whose wake-up should have come.
type OverdueRow struct {
	Scope, ID string
	Created   int64 // µs
	Seq       int
}

// RunOverdue finds up to limit waiting runs due for longer than late, whose wake-up job should
// have run by then (it was lost, or River is far behind).
func (st *Statements) RunOverdue(ctx context.Context, q Querier, limit int, late time.Duration) ([]OverdueRow, error) {
	rows, err := q.Query(ctx, st.waits.overdue, limit, micros(late))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (OverdueRow, error) {
		var o OverdueRow
		err := r.Scan(&o.Scope, &o.ID, &o.Created, &o.Seq)
		return o, err
	})
}

// EventSet publishes a run's value under name; the last write wins. created is the run's
// created_at in µs (its generation): a value over PayloadInlineMax bytes goes to the partition of
// idem_run_payloads for its UTC day, when that partition exists.
func (st *Statements) EventSet(ctx context.Context, q Querier, scope, id, name string, value []byte, created int64) error {
	if large(len(value)) {
		_, err := q.Exec(ctx, st.waits.setEventLarge, scope, id, name, value, created)
		return err
	}
	_, err := q.Exec(ctx, st.waits.setEvent, scope, id, name, value)
	return err
}

// EventRow is a run's state and, when set, its event's value.
type EventRow struct {
	State RunState
	Set   bool
	Value []byte
}

// EventGet reads the run's state and the event's value. ok is false when there is no run. A
// large value is read from its partition of idem_run_payloads, in one more query.
func (st *Statements) EventGet(ctx context.Context, q Querier, scope, id, name string) (EventRow, bool, error) {
	var e EventRow
	var day *time.Time
	err := q.QueryRow(ctx, st.waits.getEvent, scope, id, name).Scan(&e.State, &e.Set, &e.Value, &day)
	if errors.Is(err, pgx.ErrNoRows) {
		return EventRow{}, false, nil
	}
	if err == nil && day != nil && e.Value == nil {
		err = st.loadRunPayloads(ctx, q, scope, id, payloadEvent, []largeRef{{day: *day, ref: name, dst: &e.Value}})
	}
	return e, err == nil, err
}
