package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// RunState is the state of a workflow run, as stored in idem_runs.state. Package workflow's doc
// draws the diagram of how a run moves between them, and who moves it.
type RunState string

// The states of a run. A run is running until it finishes as done, failed, cancelled or timed
// out; it may wait (sleeping or awaiting a signal) in between. Only a running run has a lease,
// only a finished one expires, and a waiting one has neither: a River job wakes it.
const (
	RunRunning   RunState = "running"
	RunSleeping  RunState = "sleeping"
	RunAwaiting  RunState = "awaiting"
	RunDone      RunState = "done"
	RunFailed    RunState = "failed"
	RunCancelled RunState = "cancelled"
	RunTimedOut  RunState = "timed_out"
)

// Finished reports whether s is a final state.
func (s RunState) Finished() bool {
	return s == RunDone || s == RunFailed || s == RunCancelled || s == RunTimedOut
}

// Waiting reports whether s is a state in which the run holds nothing and waits for a River job
// to wake it.
func (s RunState) Waiting() bool { return s == RunSleeping || s == RunAwaiting }

// runStatements are the texts of the statements on idem_runs; see the function of each.
type runStatements struct {
	start, lookup, replace, enqueue, takeover, renew, finish, stuck, scan, nextExpiry, inspect,
	countByState, reconcileEnd, reconcileResume, setAttributes string
}

// keyRunColumns read a key and its run, joined from a one-row relation so that a statement
// returns one row whether the key exists or not. KeyRun is what they scan into.
const keyRunColumns = `k.scope IS NOT NULL, k.workflow, coalesce(k.expires_at > {now}, false), r.state, r.fingerprint, r.output,
	coalesce(r.expires_at > {now}, true), coalesce(r.lease_expires_at > {now}, false),
	coalesce(greatest(ceil(extract(epoch FROM r.lease_expires_at - {now})), 0), 0)::int4, coalesce(r.attempts, 0), r.lease_token,
	coalesce((extract(epoch FROM r.created_at) * 1000000)::int8, 0), coalesce(r.last_error, ''),
	coalesce(extract(epoch FROM {now} - r.lease_expires_at), 0)::float8, (extract(epoch FROM {now}) * 1000000)::int8,
	(extract(epoch FROM r.deadline) * 1000000)::int8, coalesce(r.version, '')`

const keyRunFrom = `FROM (SELECT) AS one LEFT JOIN {keys} k ON k.scope = $1 AND k.id = $2
	LEFT JOIN {runs} r ON r.scope = k.scope AND r.id = k.id`

// newRun is the head of the statements that insert a run.
const newRun = `INSERT INTO {runs} (scope, id, workflow, state, fingerprint, input, attempts, lease_token,
	lease_owner, lease_expires_at, trace_context, created_at, updated_at, deadline, concurrency_key, concurrency_limit, attributes,
	version)`

// claimReturning is what the statements that take a run's lease return; Claim reads it.
const claimReturning = `RETURNING attempts, input, (extract(epoch FROM created_at) * 1000000)::int8, coalesce(trace_context, ''),
	(extract(epoch FROM {now}) * 1000000)::int8, (extract(epoch FROM deadline) * 1000000)::int8, parent_id IS NOT NULL,
	concurrency_key, coalesce(concurrency_limit, 0)`

func newRunStatements(t Tables) runStatements {
	return runStatements{
		// The key's in-flight lock is taken without waiting (as Do takes it), and the rows are
		// inserted only when it is held and the key is free: a duplicate start is answered at
		// once instead of parking on the other's uncommitted row. The key and its run are read
		// in the same statement, from its snapshot, which cannot see the rows it inserts.
		start: t.render(`WITH lock AS (
	SELECT pg_try_advisory_xact_lock($10) AS held
), key AS (
	INSERT INTO {keys} (scope, id, workflow, created_at, expires_at)
	SELECT $1, $2, $4, {statement_now}, 'infinity' FROM lock WHERE held
	ON CONFLICT (scope, id) DO NOTHING
	RETURNING created_at
), run AS (
` + newRun + `
	SELECT $1, $2, $4, 'running', $3, $5, 1, $6, $7, {now} + $8::int8 @us, $9, created_at, created_at,
		created_at + $11::int8 @us, $12, $13, $14::jsonb, $15 FROM key
	RETURNING created_at
)
SELECT (SELECT held FROM lock), (SELECT (extract(epoch FROM created_at) * 1000000)::int8 FROM run),
	` + keyRunColumns + `
` + keyRunFrom),

		lookup: t.render(`SELECT ` + keyRunColumns + `
` + keyRunFrom),

		// The old run and its history go in the same statement that rewrites the key, so that
		// no step of the old run can be replayed into the new one.
		replace: t.render(`WITH old_run AS (
	DELETE FROM {runs} WHERE scope = $1 AND id = $2 AND state <> 'running' AND expires_at <= {now}
	RETURNING 1
), old_steps AS (
	DELETE FROM {steps} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM old_run)
), old_attempts AS (
	DELETE FROM {attempts} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM old_run)
), old_signals AS (
	DELETE FROM {signals} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM old_run)
), old_events AS (
	DELETE FROM {events} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM old_run)
), key AS (
	UPDATE {keys} SET workflow = $4, fingerprint = NULL, result = NULL, result_day = NULL, created_at = {statement_now},
		expires_at = 'infinity'
	WHERE scope = $1 AND id = $2
		AND ((workflow IS NULL AND expires_at <= {now}) OR EXISTS (SELECT FROM old_run))
		AND pg_try_advisory_xact_lock($13)
	RETURNING created_at
)
` + newRun + `
SELECT $1, $2, $4, CASE WHEN $16::bool THEN 'queued' ELSE 'running' END, $3, $5, $10, $6, $7,
	CASE WHEN $16::bool THEN NULL WHEN $11::bool THEN {now} + $8::int8 @us ELSE {now} END, $9, created_at, created_at,
	created_at + $12::int8 @us, $14, $15, $17::jsonb, $18 FROM key
RETURNING (extract(epoch FROM created_at) * 1000000)::int8, (extract(epoch FROM lease_expires_at) * 1000000)::int8`),

		// The key's in-flight lock, taken without waiting as RunStart takes it: a start that
		// has not committed yet (or a Do) holds it, and the insert would otherwise wait on its row.
		enqueue: t.render(`WITH key AS (
	INSERT INTO {keys} (scope, id, workflow, created_at, expires_at)
	SELECT $1, $2, $4, {statement_now}, 'infinity' WHERE pg_try_advisory_xact_lock($12)
	ON CONFLICT (scope, id) DO NOTHING
	RETURNING created_at
)
INSERT INTO {runs} (scope, id, workflow, state, fingerprint, input, attempts, lease_token,
	lease_owner, lease_expires_at, trace_context, created_at, updated_at, deadline, parent_scope, parent_id, parent_seq,
	parent_close, concurrency_key, concurrency_limit, attributes, version)
SELECT $1, $2, $4, CASE WHEN $15::bool THEN 'queued' ELSE 'running' END, $3, $5, 0, NULL, NULL,
	CASE WHEN $15::bool THEN NULL ELSE {now} END, $6, created_at, created_at, created_at + $7::int8 @us,
	$8, $9, $10, $11, $13, $14, $16::jsonb, $17 FROM key
RETURNING coalesce((extract(epoch FROM lease_expires_at) * 1000000)::int8, 0)`),

		takeover: t.render(`UPDATE {runs} SET lease_token = $3, lease_owner = $6, lease_expires_at = {now} + $5::int8 @us,
	attempts = attempts + 1, attempt_version = $7, updated_at = {now}
WHERE scope = $1 AND id = $2 AND state = 'running' AND lease_expires_at <= {now}
	AND lease_token IS NOT DISTINCT FROM $4
` + claimReturning),

		// A HOT update: no index of idem_runs reads lease_expires_at (see scan).
		renew: t.render(`UPDATE {runs} SET lease_expires_at = {now} + $4::int8 @us
WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`),

		// Sent with COMMIT, where no one reads the rows affected: when the writer no longer holds
		// the lease it fails (division by zero), which aborts the transaction.
		finish: t.render(`WITH finished AS (
	UPDATE {runs} SET state = $4, output = $5, lease_token = NULL, lease_owner = NULL,
		lease_expires_at = NULL, last_error = NULL, updated_at = {now}, finished_at = {now}, expires_at = {now} + $6::int8 @us
	WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'
	RETURNING 1
)
SELECT 1 / count(*)::int FROM finished`),

		stuck: t.render(`UPDATE {runs} SET last_error = $4, updated_at = {now}
WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`),

		// SKIP LOCKED passes over runs whose owner is committing a step right now (its
		// checkpoint holds the row) and over runs another scan is handling. The running runs,
		// as many as are being worked on, are read through idem_runs_state and sorted: no index
		// on lease_expires_at, so that renewing a lease or taking it over is a HOT update that
		// writes no index entry.
		scan: t.render(`SELECT scope, id, attempts, (extract(epoch FROM lease_expires_at) * 1000000)::int8
FROM {runs} WHERE state = 'running' AND lease_expires_at <= {now}
ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED`),

		nextExpiry: t.render(`SELECT (extract(epoch FROM min(lease_expires_at) - {now}) * 1000000)::int8
FROM {runs} WHERE state = 'running' AND lease_expires_at > {now}`),

		inspect: t.render(`SELECT r.state, r.workflow, r.input, r.attempts, r.lease_expires_at <= {now}, r.lease_token,
	coalesce(extract(epoch FROM {now} - r.lease_expires_at), 0)::float8,
	coalesce((SELECT s.name FROM {steps} s WHERE s.scope = r.scope AND s.id = r.id ORDER BY s.seq DESC LIMIT 1), ''),
	coalesce(r.last_error, ''), (extract(epoch FROM r.created_at) * 1000000)::int8, coalesce(r.trace_context, ''),
	coalesce(r.version, '')
FROM {runs} r WHERE r.scope = $1 AND r.id = $2`),

		countByState: t.render(`SELECT state, count(*) FROM {runs} WHERE state <> 'done' GROUP BY state`),

		reconcileEnd: t.render(`UPDATE {runs} SET state = $4, output = $5, lease_token = NULL, lease_owner = NULL,
	lease_expires_at = NULL, updated_at = {now}, finished_at = {now}, expires_at = {now} + $6::int8 @us
WHERE scope = $1 AND id = $2 AND state = 'running' AND lease_expires_at <= {now} AND lease_token IS NOT DISTINCT FROM $3`),

		// The run's row is read under the lease's fence (the row lock a step's checkpoint takes
		// too), and updated only when the result stays within the limit; either way one row
		// comes back, unless the fence failed.
		setAttributes: t.render(`WITH run AS (
	SELECT scope, id, (coalesce(attributes, '{}') || coalesce($4::jsonb, '{}')) - $5::text[] AS merged
	FROM {runs} WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running' FOR NO KEY UPDATE
), counted AS (
	SELECT scope, id, merged, (SELECT count(*) FROM jsonb_object_keys(merged))::int4 AS n FROM run
), updated AS (
	UPDATE {runs} r SET attributes = CASE WHEN c.merged = '{}' THEN NULL ELSE c.merged END
	FROM counted c WHERE r.scope = c.scope AND r.id = c.id AND c.n <= $6
	RETURNING 1
)
SELECT EXISTS (SELECT FROM updated), n FROM counted`),

		reconcileResume: t.render(`UPDATE {runs} SET lease_token = NULL, lease_owner = NULL,
	lease_expires_at = {now} + $4::int8 @us, attempts = 0, updated_at = {now}
WHERE scope = $1 AND id = $2 AND state = 'running' AND lease_expires_at <= {now} AND lease_token IS NOT DISTINCT FROM $3`),
	}
}

// KeyRun is a key and its run, if it has one, as RunStart and RunLookup read them.
type KeyRun struct {
	Found       bool      // the key exists
	KeyWorkflow *string   // the workflow the key belongs to; nil for a key of idem.Do
	KeyLive     bool      // Do's key: not expired
	State       *RunState // nil when the key has no run
	Fingerprint []byte
	Output      []byte
	RunLive     bool          // running, or finished and not expired
	LeaseLive   bool          // a process holds the run's lease
	LeaseLeft   time.Duration // until the lease runs out, rounded up to a second
	Attempts    int
	Token       *pgtype.UUID // the lease's fencing token, nil when no one holds it
	Created     int64        // the run's creation, µs since the epoch: its generation
	LastError   string
	ExpiredFor  time.Duration // since the lease ran out (negative while it is live)
	Now         int64         // Postgres's clock, µs
	Deadline    *int64        // the run's deadline, µs; nil for none
	Version     string        // the code version that started the run; "" when not recorded
}

func scanKeyRun(dest []any, r *KeyRun) []any {
	return append(dest, &r.Found, &r.KeyWorkflow, &r.KeyLive, &r.State, &r.Fingerprint, &r.Output, &r.RunLive, &r.LeaseLive,
		(*secondsDuration)(&r.LeaseLeft), &r.Attempts, &r.Token, &r.Created, &r.LastError, (*floatSecondsDuration)(&r.ExpiredFor),
		&r.Now, &r.Deadline, &r.Version)
}

// secondsDuration scans an int4 of seconds into a time.Duration.
type secondsDuration time.Duration

func (d *secondsDuration) ScanInt64(v pgtype.Int8) error {
	*d = secondsDuration(time.Duration(v.Int64) * time.Second)
	return nil
}

// floatSecondsDuration scans a float8 of seconds into a time.Duration.
type floatSecondsDuration time.Duration

func (d *floatSecondsDuration) ScanFloat64(v pgtype.Float8) error {
	*d = floatSecondsDuration(time.Duration(v.Float64 * float64(time.Second)))
	return nil
}

// RunStartParams are a new run's: its key, what it runs, and the lease of the process that starts
// it. The lock id is the key's (see LockID), computed by RunStart.
type RunStartParams struct {
	Scope, ID   string
	Fingerprint []byte
	Workflow    string
	Input       []byte
	Token       pgtype.UUID
	Owner       string
	Lease       time.Duration
	Trace       string            // W3C traceparent of the span that starts the run; "" for none
	Timeout     time.Duration     // the run's deadline after its creation; 0 for none
	Concurrency *Concurrency      // the run's concurrency key and limit; nil for none
	Attributes  map[string]string // the run's attributes; none when empty
	Version     string            // the code version of the process that starts it
}

// Concurrency is a run's concurrency key and the limit of active runs with it.
type Concurrency struct {
	Key   string
	Limit int
}

func (c *Concurrency) args() (key, limit any) {
	if c == nil {
		return nil, nil
	}
	return c.Key, c.Limit
}

// RunStartRow is what RunStart found: whether it took the key's in-flight lock, whether it
// started the run (then Created is its creation, µs), and the key and run as they were before
// the statement (when the key was taken, they say by what).
type RunStartRow struct {
	Locked  bool
	Started bool
	Created int64
	KeyRun  KeyRun
}

// RunStart starts a run in the caller's transaction if its key is free: it takes the key's
// in-flight lock without waiting, and inserts the key and the run, with the caller's lease, when
// the lock is held and the key does not exist; in every case it reads the key and its run. It is
// the first statement of a run's first transaction (sent with BEGIN), so that a duplicate, a
// replay or a mismatch is answered before any workflow code runs. Read its row with ScanRunStart.
func (st *Statements) RunStart(p RunStartParams) Stmt {
	ck, cl := p.Concurrency.args()
	return Stmt{SQL: st.runs.start, Args: []any{p.Scope, p.ID, p.Fingerprint, p.Workflow, p.Input, p.Token, p.Owner, micros(p.Lease),
		nullText(p.Trace), LockID(st.schema, p.Scope, p.ID), nullMicros(p.Timeout), ck, cl, attributesArg(p.Attributes),
		p.Version}}
}

// ScanRunStart reads RunStart's row.
func ScanRunStart(row pgx.Row) (RunStartRow, error) {
	var r RunStartRow
	var created *int64
	if err := row.Scan(scanKeyRun([]any{&r.Locked, &created}, &r.KeyRun)...); err != nil {
		return RunStartRow{}, err
	}
	if created != nil {
		r.Started, r.Created = true, *created
	}
	return r, nil
}

// RunLookup reads a key and its run, without locking anything.
func (st *Statements) RunLookup(ctx context.Context, q Querier, scope, id string) (KeyRun, error) {
	var r KeyRun
	if err := q.QueryRow(ctx, st.runs.lookup, scope, id).Scan(scanKeyRun(nil, &r)...); err != nil {
		return KeyRun{}, err
	}
	return r, nil
}

// RunReplaceParams give a key that finished and expired to a new run: as RunStartParams, and
// whether the new run is leased by the caller (Workflow.Run) or left ownerless for a resume job
// (StartTx, Token zero), or queued for a slot of its concurrency key (StartTx).
type RunReplaceParams struct {
	RunStartParams
	Leased bool
	Queued bool
}

// RunReplaced is the new run under a replaced key: its creation and lease expiry, µs.
type RunReplaced struct {
	Created, LeaseExpires int64
}

// RunReplace gives a key that finished and expired (Do's or a run's) to a new run: the old run
// and everything it left (steps, attempts, signals, events) are deleted and the key rewritten in
// one statement, under the key's in-flight lock (taken without waiting; RunStart's transaction
// holds it already). ok is false when the key was not reusable by the time the statement got to
// it, or another transaction holds its lock.
func (st *Statements) RunReplace(ctx context.Context, q Querier, p RunReplaceParams) (r RunReplaced, ok bool, err error) {
	attempts := 0
	var token, owner any
	if p.Leased {
		attempts, token, owner = 1, p.Token, p.Owner
	}
	ck, cl := p.Concurrency.args()
	var expires *int64
	err = q.QueryRow(ctx, st.runs.replace, p.Scope, p.ID, p.Fingerprint, p.Workflow, p.Input, token, owner, micros(p.Lease),
		nullText(p.Trace), attempts, p.Leased, nullMicros(p.Timeout), LockID(st.schema, p.Scope, p.ID), ck, cl, p.Queued,
		attributesArg(p.Attributes), p.Version).Scan(&r.Created, &expires)
	if expires != nil {
		r.LeaseExpires = *expires
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, err
}

// RunEnqueueParams are a run started without an owner (StartTx, RunFork, a child): a resume job
// takes it.
type RunEnqueueParams struct {
	Scope, ID   string
	Fingerprint []byte
	Workflow    string
	Input       []byte
	Trace       string
	Timeout     time.Duration
	Parent      *ParentRef        // the run whose step starts this one; nil for none
	Concurrency *Concurrency      // the run's concurrency key and limit; nil for none
	Queued      bool              // the run waits for a slot of its key (see RunAdmit); no resume job yet
	Attributes  map[string]string // the run's attributes; none when empty
	Version     string            // the code version the run is started for
}

// ParentRef is the run that started a child run, at which step, and what its cancel does to the
// child: ParentCancel or ParentAbandon.
type ParentRef struct {
	Scope, ID string
	Seq       int
	Close     string
}

// What a parent's cancel (or timeout) does to a child that has not finished.
const (
	ParentCancel  = "cancel"
	ParentAbandon = "abandon"
)

// RunEnqueue creates a run with no owner and a lease that is already over, and its key, if the
// key is free and its in-flight lock can be taken without waiting. It returns the lease's expiry
// in µs, the generation that makes the resume job unique; ok is false when the key exists or
// another transaction holds its lock (a start in flight: RunLookup tells which).
func (st *Statements) RunEnqueue(ctx context.Context, q Querier, p RunEnqueueParams) (generation int64, ok bool, err error) {
	var pScope, pID, pClose any
	var pSeq any
	if p.Parent != nil {
		pScope, pID, pSeq, pClose = p.Parent.Scope, p.Parent.ID, p.Parent.Seq, p.Parent.Close
	}
	ck, cl := p.Concurrency.args()
	err = q.QueryRow(ctx, st.runs.enqueue, p.Scope, p.ID, p.Fingerprint, p.Workflow, p.Input, nullText(p.Trace),
		nullMicros(p.Timeout), pScope, pID, pSeq, pClose, LockID(st.schema, p.Scope, p.ID), ck, cl, p.Queued,
		attributesArg(p.Attributes), p.Version).Scan(&generation)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return generation, err == nil, err
}

// Claim is a run as a statement that took its lease returned it (RunTakeover, WaitWake).
type Claim struct {
	Attempts  int
	Input     []byte
	Created   int64 // µs
	Trace     string
	Now       int64  // Postgres's clock, µs
	Deadline  *int64 // µs; nil for none
	HasParent bool   // a child run: its end wakes its parent
	// Concurrency is the run's concurrency key and limit: its end starts a queued run of its
	// key. nil for none.
	Concurrency *Concurrency
}

func scanClaim(row pgx.Row) (Claim, bool, error) {
	var c Claim
	var key *string
	var limit int
	err := row.Scan(&c.Attempts, &c.Input, &c.Created, &c.Trace, &c.Now, &c.Deadline, &c.HasParent, &key, &limit)
	if key != nil {
		c.Concurrency = &Concurrency{Key: *key, Limit: limit}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return Claim{}, false, nil
	}
	return c, err == nil, err
}

// LeaseParams name a run and the lease its holder presents.
type LeaseParams struct {
	Scope, ID string
	Token     pgtype.UUID
}

// TakeoverParams take the lease of a run whose lease expired, if it still has the token the
// taker saw (Old; nil when it had none), for Owner, running code of Version.
type TakeoverParams struct {
	LeaseParams
	Old     *pgtype.UUID
	Owner   string
	Lease   time.Duration
	Version string
}

// RunTakeover takes the lease of a run whose lease expired and that still has the token the taker
// saw: of two takers, one wins. ok is false for the other, and when the run is no longer running
// with an expired lease. The run's attempt_version becomes the taker's.
func (st *Statements) RunTakeover(ctx context.Context, q Querier, p TakeoverParams) (Claim, bool, error) {
	return scanClaim(q.QueryRow(ctx, st.runs.takeover, p.Scope, p.ID, p.Token, p.Old, micros(p.Lease), p.Owner, p.Version))
}

// RunRenew extends the lease of its holder. ok is false when the caller no longer holds it.
func (st *Statements) RunRenew(ctx context.Context, q Querier, p LeaseParams, lease time.Duration) (ok bool, err error) {
	tag, err := q.Exec(ctx, st.runs.renew, p.Scope, p.ID, p.Token, micros(lease))
	return tag.RowsAffected() == 1, err
}

// RunFinishParams are a run's outcome: its final state and output, kept for TTL.
type RunFinishParams struct {
	LeaseParams
	State  RunState
	Output []byte
	TTL    time.Duration
}

// RunFinish stores a run's outcome if the writer holds the lease, to be sent with COMMIT: when
// the writer no longer holds it, the statement fails and aborts the transaction
// (IsFinishFenceError).
func (st *Statements) RunFinish(p RunFinishParams) Stmt {
	return Stmt{SQL: st.runs.finish, Args: []any{p.Scope, p.ID, p.Token, string(p.State), p.Output, micros(p.TTL)}}
}

// IsFinishFenceError reports whether err is RunFinish's failed fence.
func IsFinishFenceError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22012"
}

// RunStuck records why a run stopped, keeping the lease: the run is retried when it expires.
func (st *Statements) RunStuck(ctx context.Context, q Querier, p LeaseParams, message string) error {
	_, err := q.Exec(ctx, st.runs.stuck, p.Scope, p.ID, p.Token, message)
	return err
}

// ScanRow is a run whose lease expired, as RunScan found it.
type ScanRow struct {
	Scope, ID   string
	Attempts    int
	LeaseExpiry int64 // µs
}

// RunScan finds up to limit runs whose lease expired, locking them (FOR UPDATE SKIP LOCKED) for
// the rest of the caller's transaction, in which it inserts their resume jobs.
func (st *Statements) RunScan(ctx context.Context, q Querier, limit int) ([]ScanRow, error) {
	rows, err := q.Query(ctx, st.runs.scan, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ScanRow, error) {
		var s ScanRow
		err := r.Scan(&s.Scope, &s.ID, &s.Attempts, &s.LeaseExpiry)
		return s, err
	})
}

// RunNextExpiry says how long until the next live lease of a running run runs out, by
// Postgres's clock; ok is false when no lease is live.
func (st *Statements) RunNextExpiry(ctx context.Context, q Querier) (d time.Duration, ok bool, err error) {
	var us *int64
	if err := q.QueryRow(ctx, st.runs.nextExpiry).Scan(&us); err != nil {
		return 0, false, err
	}
	if us == nil {
		return 0, false, nil
	}
	return time.Duration(*us) * time.Microsecond, true, nil
}

// Inspected is a run as the resume job reads it.
type Inspected struct {
	State         RunState
	Workflow      string
	Input         []byte
	Attempts      int
	Expired       *bool // the lease ran out; nil when there is none
	Token         *pgtype.UUID
	ExpiredFor    time.Duration
	RecoveryPoint string // the name of the last completed step, "" for none
	LastError     string
	Created       int64 // µs
	Trace         string
	Version       string // the code version that started the run; "" when not recorded
}

// RunInspect reads a run for the resume job. ok is false when there is none.
func (st *Statements) RunInspect(ctx context.Context, q Querier, scope, id string) (Inspected, bool, error) {
	var r Inspected
	err := q.QueryRow(ctx, st.runs.inspect, scope, id).Scan(&r.State, &r.Workflow, &r.Input, &r.Attempts, &r.Expired, &r.Token,
		(*floatSecondsDuration)(&r.ExpiredFor), &r.RecoveryPoint, &r.LastError, &r.Created, &r.Trace, &r.Version)
	if errors.Is(err, pgx.ErrNoRows) {
		return Inspected{}, false, nil
	}
	return r, err == nil, err
}

// RunCountByState counts the runs in each state but done, from the partial index on state, for
// the gauge of runs by state. Done runs, the bulk of the table, are left out.
func (st *Statements) RunCountByState(ctx context.Context, q Querier) (map[RunState]int64, error) {
	rows, err := q.Query(ctx, st.runs.countByState)
	if err != nil {
		return nil, err
	}
	counts := map[RunState]int64{}
	var (
		state RunState
		n     int64
	)
	_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		counts[state] = n
		return nil
	})
	return counts, err
}

// RunReconcileEnd finishes a run the reconcile hook decided on, fenced like a takeover: only if
// it still has the expired lease (token old) that was inspected. ok is false otherwise.
func (st *Statements) RunReconcileEnd(ctx context.Context, q Querier, scope, id string, old *pgtype.UUID, state RunState, output []byte, ttl time.Duration) (bool, error) {
	tag, err := q.Exec(ctx, st.runs.reconcileEnd, scope, id, old, string(state), output, micros(ttl))
	return tag.RowsAffected() == 1, err
}

// RunReconcileResume leaves the run running with a fresh budget of attempts and no owner, to be
// resumed after pause; fenced as RunReconcileEnd.
func (st *Statements) RunReconcileResume(ctx context.Context, q Querier, scope, id string, old *pgtype.UUID, pause time.Duration) (bool, error) {
	tag, err := q.Exec(ctx, st.runs.reconcileResume, scope, id, old, micros(pause))
	return tag.RowsAffected() == 1, err
}
