package store

// WaitStatements are package workflow's statements for waiting runs (sleep, await), signals,
// events and deadlines. Arguments are listed as $n = name.
type WaitStatements struct {
	// Lock takes the run's row FOR UPDATE if the caller holds its lease, at the start of a wait
	// step's transaction. FOR UPDATE conflicts with Signal's FOR KEY SHARE, so a signal being
	// sent and a run about to wait are ordered: whichever locks second sees the other's commit,
	// and a signal is never missed between the mailbox check and the suspension. Lease renewals
	// and checkpoints take weaker locks and do not wait for signals.
	// $1 scope, $2 id, $3 token. Returns now µs, deadline µs, wait_seq, wait_name, wake_at µs.
	Lock string

	// Consume marks the oldest pending signal of a name as consumed by the step at seq.
	// $1 scope, $2 id, $3 name, $4 step seq. Returns the signal's seq and payload, or no row.
	Consume string

	// Suspend gives up the lease and leaves the run waiting. $1 scope, $2 id, $3 token,
	// $4 state, $5 step seq, $6 signal name, $7 wake_at µs (NULL for none).
	Suspend string

	// Inspect reads a waiting run for the wake-up job. $1 scope, $2 id. Returns state, workflow,
	// created_at µs, wait_seq, whether the deadline has passed.
	Inspect string

	// Wake takes a waiting run with a new lease, if it still waits at the step the job was made
	// for ($4, or any step when 0) in the same generation ($3). $5 token, $6 owner, $7 lease µs.
	// Returns attempts, input, created_at µs, trace context, now µs, deadline µs.
	Wake string

	// TimeOut finishes a waiting run whose deadline has passed as timed out, without waking
	// it. $1 scope, $2 id, $3 created_at µs, $4 output, $5 TTL µs.
	TimeOut string

	// Signal records a signal in the caller's transaction, unless the run is unknown or
	// finished, or the dedupe id was seen before. It locks the run FOR KEY SHARE (see Lock).
	// $1 scope, $2 id, $3 name, $4 payload, $5 dedupe id. Returns the run's state, whether it
	// awaits this signal now, its wait_seq, created_at µs, the signal's seq (NULL for a
	// duplicate or a refused signal) and updated_at µs (while the run waits, when its wait
	// began); no row when the run is unknown.
	Signal string

	// Overdue finds waiting runs due for longer than $2 µs, whose wake-up job should have run by
	// then (it was lost, or River is far behind). $1 limit. Returns scope, id, created_at µs,
	// wait_seq.
	Overdue string

	// SetEvent publishes a run's value under a name; the last write wins.
	// $1 scope, $2 id, $3 name, $4 value.
	SetEvent string

	// GetEvent reads the run's state and the event's value. $1 scope, $2 id, $3 name.
	GetEvent string
}

func waitStatements(t Tables) WaitStatements {
	return WaitStatements{
		Lock: t.render(`SELECT (extract(epoch FROM now()) * 1000000)::int8, (extract(epoch FROM deadline) * 1000000)::int8,
	wait_seq, wait_name, (extract(epoch FROM wake_at) * 1000000)::int8
FROM {runs} WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'
FOR UPDATE`),

		Consume: t.render(`UPDATE {signals} SET consumed_at = now(), consumed_step = $4
WHERE scope = $1 AND id = $2 AND consumed_at IS NULL AND seq = (
	SELECT seq FROM {signals} WHERE scope = $1 AND id = $2 AND name = $3 AND consumed_at IS NULL ORDER BY seq LIMIT 1
)
RETURNING seq, payload`),

		Suspend: t.render(`UPDATE {runs} SET state = $4, wait_seq = $5, wait_name = $6,
	wake_at = 'epoch'::timestamptz + $7::int8 @us, lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
	last_error = NULL, attempts = 0, updated_at = now()
WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`),

		Inspect: t.render(`SELECT state, workflow, (extract(epoch FROM created_at) * 1000000)::int8, coalesce(wait_seq, 0),
	coalesce(deadline <= now(), false)
FROM {runs} WHERE scope = $1 AND id = $2`),

		Wake: t.render(`UPDATE {runs} SET state = 'running', lease_token = $5, lease_owner = $6,
	lease_expires_at = now() + $7::int8 @us, attempts = attempts + 1, updated_at = now()
WHERE scope = $1 AND id = $2 AND state IN ('sleeping', 'awaiting')
	AND (extract(epoch FROM created_at) * 1000000)::int8 = $3 AND ($4::int4 = 0 OR wait_seq = $4)
` + ClaimReturning),

		TimeOut: t.render(`UPDATE {runs} SET state = 'timed_out', output = $4, lease_token = NULL, lease_owner = NULL,
	lease_expires_at = NULL, last_error = NULL, updated_at = now(), finished_at = now(), expires_at = now() + $5::int8 @us
WHERE scope = $1 AND id = $2 AND state IN ('sleeping', 'awaiting')
	AND (extract(epoch FROM created_at) * 1000000)::int8 = $3 AND deadline <= now()`),

		Signal: t.render(`WITH run AS (
	SELECT state, wait_name, wait_seq, (extract(epoch FROM created_at) * 1000000)::int8 AS created,
		(extract(epoch FROM updated_at) * 1000000)::int8 AS suspended
	FROM {runs} WHERE scope = $1 AND id = $2
	FOR KEY SHARE
), sig AS (
	INSERT INTO {signals} (scope, id, name, payload, dedupe_id)
	SELECT $1, $2, $3, $4, $5 FROM run WHERE run.state NOT IN ('done', 'failed', 'cancelled', 'timed_out')
	ON CONFLICT (scope, id, dedupe_id) WHERE dedupe_id IS NOT NULL DO NOTHING
	RETURNING seq
)
SELECT run.state, run.state = 'awaiting' AND run.wait_name IS NOT DISTINCT FROM $3, coalesce(run.wait_seq, 0), run.created,
	(SELECT seq FROM sig), run.suspended
FROM run`),

		Overdue: t.render(`SELECT scope, id, (extract(epoch FROM created_at) * 1000000)::int8, coalesce(wait_seq, 0)
FROM {runs} WHERE state IN ('sleeping', 'awaiting') AND least(wake_at, deadline) <= now() - $2::int8 @us
ORDER BY least(wake_at, deadline) LIMIT $1`),

		SetEvent: t.render(`INSERT INTO {events} (scope, id, name, value) VALUES ($1, $2, $3, $4)
ON CONFLICT (scope, id, name) DO UPDATE SET value = excluded.value, updated_at = now()`),

		GetEvent: t.render(`SELECT r.state, e.name IS NOT NULL, e.value
FROM {runs} r LEFT JOIN {events} e ON e.scope = r.scope AND e.id = r.id AND e.name = $3
WHERE r.scope = $1 AND r.id = $2`),
	}
}
