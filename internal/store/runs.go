package store

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// RunState is the state of a workflow run, as stored in idem_runs.state.
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

// RunStatements are package workflow's statements on idem_runs and idem_steps. Their arguments
// are listed as $n = name.
type RunStatements struct {
	// Start creates a run with this process's lease, and its key, if the key is free: one
	// statement, which inserts nothing when the key exists, or when another transaction holds
	// the key's in-flight lock (a run whose first step has not committed yet, a Do running
	// now): it takes that lock without waiting, as Do does, so a duplicate start is answered at
	// once instead of parking on the other's uncommitted row.
	// $1 scope, $2 id, $3 fingerprint, $4 workflow, $5 input, $6 lease token, $7 lease owner,
	// $8 lease µs, $9 trace context, $10 lock id, $11 timeout µs (the deadline is created_at
	// plus it; NULL for none). Returns created_at in µs.
	Start string

	// Enqueue is Start for StartTx: a run with no owner yet (no token, a lease that is already
	// over), so that the resume job inserted beside it takes it at once.
	// $1 scope, $2 id, $3 fingerprint, $4 workflow, $5 input, $6 trace context, $7 timeout µs.
	// Returns lease_expires_at in µs, the generation that makes the resume job unique.
	Enqueue string

	// Lookup reads a key and its run, if it has one. $1 scope, $2 id.
	Lookup string

	// Replace gives a key that finished and expired (Do's or a run's) to a new run: the old run
	// and its history are deleted and the key row rewritten in one statement, so that no step of
	// the old run can be replayed into the new one. Arguments as Start, plus $10 attempts,
	// $11 whether the lease is taken (false for StartTx) and $12 timeout µs. Returns created_at in µs, or no row if
	// the key was not reusable by the time the statement got to it.
	Replace string

	// Takeover takes the lease of a run whose lease expired and that still has the token the
	// taker saw: of two takers, one wins. $1 scope, $2 id, $3 new token, $4 old token,
	// $5 lease µs, $6 owner. Returns attempts, input, created_at µs, trace context, now µs,
	// deadline µs (or NULL).
	Takeover string

	// History reads a run's completed steps in order. $1 scope, $2 id.
	History string

	// Checkpoint writes a step's row only if the writer still holds the lease, in the same
	// transaction as the step's own writes. The fence locks the run's row until COMMIT, so a
	// takeover or a cancel waits for the step to commit or roll back and then sees the new
	// history. When the fence finds no row (the lease was lost, or the run cancelled), the row it
	// tries to write has no scope, and the NOT NULL constraint fails the statement: a lost lease
	// is an error that aborts the transaction, so the checkpoint can travel with COMMIT and still
	// stop the step's writes from committing. See IsFenceError.
	// $1 scope, $2 id, $3 token, $4 seq, $5 name, $6 kind, $7 output, $8 error, $9 attempts.
	Checkpoint string

	// CheckpointInFenced writes a step's row without a fence of its own, for a transaction in
	// which another statement fences (Checkpoint or FinishFenced): one row lock on the run per
	// transaction is enough to make a takeover wait for it. Arguments as Checkpoint.
	CheckpointInFenced string

	// Step reads one step of the history. $1 scope, $2 id, $3 seq.
	Step string

	// Renew extends the lease of its holder. $1 scope, $2 id, $3 token, $4 lease µs.
	Renew string

	// Finish stores a run's outcome, if the writer still holds the lease. $1 scope, $2 id,
	// $3 token, $4 state, $5 output, $6 TTL µs.
	Finish string

	// FinishFenced is Finish for a batch sent with COMMIT, where no one reads the rows affected:
	// when the writer no longer holds the lease, it fails (division by zero), which aborts the
	// transaction. See IsFinishFenceError.
	FinishFenced string

	// Stuck records why a run stopped, keeping the lease: the run is retried when the lease
	// expires. $1 scope, $2 id, $3 token, $4 message.
	Stuck string

	// Scan finds runs whose lease expired. SKIP LOCKED passes over runs whose owner is
	// committing a step right now (its checkpoint holds the row) and over runs another scan is
	// handling. $1 limit.
	Scan string

	// Inspect reads a run for the resume job. $1 scope, $2 id.
	Inspect string

	// CountByState counts the runs in each state but done, from the partial index on state, for
	// the gauge of runs by state. Done runs, the bulk of the table, are left out.
	CountByState string

	// ReconcileEnd finishes a run the reconcile hook decided on, fenced like a takeover.
	// $1 scope, $2 id, $3 old token, $4 state, $5 output, $6 TTL µs.
	ReconcileEnd string

	// ReconcileResume leaves the run running with a fresh budget of attempts, to be resumed after
	// a pause. $1 scope, $2 id, $3 old token, $4 pause µs.
	ReconcileResume string
}

// finish stores a run's outcome, if the writer holds the lease (Finish, and inside FinishFenced).
const finish = `UPDATE {runs} SET state = $4, output = $5, lease_token = NULL, lease_owner = NULL,
	lease_expires_at = NULL, last_error = NULL, updated_at = now(), finished_at = now(), expires_at = now() + $6::int8 @us
WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`

// ClaimReturning is what the statements that take a run's lease (Runs.Takeover, Waits.Wake)
// return, in this order: attempts, input, created_at µs, trace context, now µs, deadline µs.
const ClaimReturning = `RETURNING attempts, input, (extract(epoch FROM created_at) * 1000000)::int8, coalesce(trace_context, ''),
	(extract(epoch FROM now()) * 1000000)::int8, (extract(epoch FROM deadline) * 1000000)::int8`

func runStatements(t Tables) RunStatements {
	const newRun = `INSERT INTO {runs} (scope, id, workflow, state, fingerprint, input, attempts, lease_token,
	lease_owner, lease_expires_at, trace_context, created_at, updated_at, deadline)`
	return RunStatements{
		Start: t.render(`WITH key AS (
	INSERT INTO {keys} (scope, id, workflow, created_at, expires_at)
	SELECT $1, $2, $4, statement_timestamp(), 'infinity' WHERE pg_try_advisory_xact_lock($10)
	ON CONFLICT (scope, id) DO NOTHING
	RETURNING created_at
)
` + newRun + `
SELECT $1, $2, $4, 'running', $3, $5, 1, $6, $7, now() + $8::int8 @us, $9, created_at, created_at,
	created_at + $11::int8 @us FROM key
RETURNING (extract(epoch FROM created_at) * 1000000)::int8`),

		Enqueue: t.render(`WITH key AS (
	INSERT INTO {keys} (scope, id, workflow, created_at, expires_at)
	VALUES ($1, $2, $4, statement_timestamp(), 'infinity')
	ON CONFLICT (scope, id) DO NOTHING
	RETURNING created_at
)
` + newRun + `
SELECT $1, $2, $4, 'running', $3, $5, 0, NULL, NULL, now(), $6, created_at, created_at, created_at + $7::int8 @us FROM key
RETURNING (extract(epoch FROM lease_expires_at) * 1000000)::int8`),

		Lookup: t.render(`SELECT k.workflow, k.expires_at > now(), r.state, r.fingerprint, r.output, r.input,
	coalesce(r.expires_at > now(), true), coalesce(r.lease_expires_at > now(), false),
	greatest(ceil(extract(epoch FROM r.lease_expires_at - now())), 0)::int4, coalesce(r.attempts, 0), r.lease_token,
	coalesce((extract(epoch FROM r.created_at) * 1000000)::int8, 0), coalesce(r.last_error, ''),
	coalesce(extract(epoch FROM now() - r.lease_expires_at), 0)::float8, coalesce(r.trace_context, '')
FROM {keys} k LEFT JOIN {runs} r ON r.scope = k.scope AND r.id = k.id
WHERE k.scope = $1 AND k.id = $2`),

		Replace: t.render(`WITH old_run AS (
	DELETE FROM {runs} WHERE scope = $1 AND id = $2 AND state <> 'running' AND expires_at <= now()
	RETURNING 1
), old_steps AS (
	DELETE FROM {steps} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM old_run)
), old_signals AS (
	DELETE FROM {signals} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM old_run)
), old_events AS (
	DELETE FROM {events} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM old_run)
), key AS (
	UPDATE {keys} SET workflow = $4, fingerprint = NULL, result = NULL, created_at = statement_timestamp(),
		expires_at = 'infinity'
	WHERE scope = $1 AND id = $2
		AND ((workflow IS NULL AND expires_at <= now()) OR EXISTS (SELECT FROM old_run))
	RETURNING created_at
)
` + newRun + `
SELECT $1, $2, $4, 'running', $3, $5, $10, $6, $7,
	CASE WHEN $11::bool THEN now() + $8::int8 @us ELSE now() END, $9, created_at, created_at, created_at + $12::int8 @us FROM key
RETURNING (extract(epoch FROM created_at) * 1000000)::int8, (extract(epoch FROM lease_expires_at) * 1000000)::int8`),

		Takeover: t.render(`UPDATE {runs} SET lease_token = $3, lease_owner = $6, lease_expires_at = now() + $5::int8 @us,
	attempts = attempts + 1, updated_at = now()
WHERE scope = $1 AND id = $2 AND state = 'running' AND lease_expires_at <= now()
	AND lease_token IS NOT DISTINCT FROM $4
` + ClaimReturning),

		History: t.render(`SELECT seq, name, kind, output, error, attempts FROM {steps} WHERE scope = $1 AND id = $2 ORDER BY seq`),

		Checkpoint: t.render(`WITH fence AS (
	SELECT scope, id FROM {runs} WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'
	FOR NO KEY UPDATE
)
INSERT INTO {steps} (scope, id, seq, name, kind, output, error, attempts)
SELECT fence.scope, fence.id, $4, $5, $6, $7, $8, $9 FROM (SELECT) AS one LEFT JOIN fence ON true`),

		CheckpointInFenced: t.render(`INSERT INTO {steps} (scope, id, seq, name, kind, output, error, attempts)
SELECT $1, $2, $4, $5, $6, $7, $8, $9 WHERE $3::uuid IS NOT NULL`),

		Step: t.render(`SELECT output, error, attempts FROM {steps} WHERE scope = $1 AND id = $2 AND seq = $3`),

		Renew: t.render(`UPDATE {runs} SET lease_expires_at = now() + $4::int8 @us
WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`),

		Finish: t.render(finish),

		FinishFenced: t.render(`WITH finished AS (` + finish + `
	RETURNING 1
)
SELECT 1 / count(*)::int FROM finished`),

		Stuck: t.render(`UPDATE {runs} SET last_error = $4, updated_at = now()
WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`),

		Scan: t.render(`SELECT scope, id, attempts, (extract(epoch FROM lease_expires_at) * 1000000)::int8
FROM {runs} WHERE state = 'running' AND lease_expires_at <= now()
ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED`),

		Inspect: t.render(`SELECT r.state, r.workflow, r.input, r.attempts, r.lease_expires_at <= now(), r.lease_token,
	coalesce(extract(epoch FROM now() - r.lease_expires_at), 0)::float8,
	coalesce((SELECT s.name FROM {steps} s WHERE s.scope = r.scope AND s.id = r.id ORDER BY s.seq DESC LIMIT 1), ''),
	coalesce(r.last_error, ''), (extract(epoch FROM r.created_at) * 1000000)::int8, coalesce(r.trace_context, '')
FROM {runs} r WHERE r.scope = $1 AND r.id = $2`),

		CountByState: t.render(`SELECT state, count(*) FROM {runs} WHERE state <> 'done' GROUP BY state`),

		ReconcileEnd: t.render(`UPDATE {runs} SET state = $4, output = $5, lease_token = NULL, lease_owner = NULL,
	lease_expires_at = NULL, updated_at = now(), finished_at = now(), expires_at = now() + $6::int8 @us
WHERE scope = $1 AND id = $2 AND state = 'running' AND lease_expires_at <= now() AND lease_token IS NOT DISTINCT FROM $3`),

		ReconcileResume: t.render(`UPDATE {runs} SET lease_token = NULL, lease_owner = NULL,
	lease_expires_at = now() + $4::int8 @us, attempts = 0, updated_at = now()
WHERE scope = $1 AND id = $2 AND state = 'running' AND lease_expires_at <= now() AND lease_token IS NOT DISTINCT FROM $3`),
	}
}

// IsFenceError reports whether err is Checkpoint's failed fence: the writer no longer holds the
// run's lease, or the run is no longer running.
func IsFenceError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23502" && pgErr.TableName == "idem_steps" && pgErr.ColumnName == "scope"
}

// IsFinishFenceError reports whether err is FinishFenced's failed fence.
func IsFinishFenceError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22012"
}
