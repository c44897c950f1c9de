package workflow

import (
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// statements holds the SQL of one schema, built once so that the text is identical on every call
// and pgx prepares each statement once per connection. Durations travel as microseconds and all
// time arithmetic happens in Postgres: a lease is a promise about the database's clock, never
// about the clocks of the processes that compete for it.
type statements struct {
	start, lookup, replace, takeover, history    string
	checkpoint, stepLookup, renew, finish, stuck string
	scan, inspect, reconcileEnd, reconcileResume string
	reap, enqueue                                string
}

var statementCache sync.Map // schema -> *statements

func statementsFor(schema string) *statements {
	if s, ok := statementCache.Load(schema); ok {
		return s.(*statements)
	}
	keys, steps := "idem_keys", "idem_steps"
	if schema != "" {
		keys = pgx.Identifier{schema, "idem_keys"}.Sanitize()
		steps = pgx.Identifier{schema, "idem_steps"}.Sanitize()
	}
	r := strings.NewReplacer("idem_keys", keys, "idem_steps", steps, "@us", "* interval '1 microsecond'")
	s := &statements{
		// The fast path of a first call: one statement that either creates the run, with this
		// process's lease, or does nothing because the key exists. ON CONFLICT waits for a
		// concurrent insert of the same key to end, so two concurrent starts make one run.
		start: r.Replace(`INSERT INTO idem_keys (scope, id, state, fingerprint, workflow, input, lease_token, locked_until, attempts, expires_at)
VALUES ($1, $2, 'running', $3, $4, $5, $6, now() + $7::int8 @us, 1, now() + $8::int8 @us)
ON CONFLICT (scope, id) DO NOTHING
RETURNING (extract(epoch FROM created_at) * 1000000)::int8`),

		// A run started by StartTx has no owner yet: no token, and a lease that is already over,
		// so that the resume job inserted beside it takes it at once.
		enqueue: r.Replace(`INSERT INTO idem_keys (scope, id, state, fingerprint, workflow, input, lease_token, locked_until, attempts, expires_at)
VALUES ($1, $2, 'running', $3, $4, $5, NULL, now(), 0, now() + $6::int8 @us)
ON CONFLICT (scope, id) DO NOTHING
RETURNING (extract(epoch FROM locked_until) * 1000000)::int8`),

		lookup: r.Replace(`SELECT state, workflow, fingerprint, result, input, expires_at > now(), locked_until > now(),
	greatest(ceil(extract(epoch FROM locked_until - now())), 0)::int4, attempts, lease_token,
	(extract(epoch FROM created_at) * 1000000)::int8, coalesce(recovery_point, ''), coalesce(last_error, ''),
	coalesce(extract(epoch FROM now() - locked_until), 0)::float8
FROM idem_keys WHERE scope = $1 AND id = $2`),

		// A finished key past its expiry is a new key: take it over, and drop the old run's
		// history in the same statement so that no step of it can be replayed into the new run.
		replace: r.Replace(`WITH taken AS (
	UPDATE idem_keys SET state = 'running', fingerprint = $3, workflow = $4, input = $5, result = NULL,
		recovery_point = NULL, last_error = NULL, lease_token = $6, locked_until = now() + $7::int8 @us,
		attempts = 1, created_at = now(), expires_at = now() + $8::int8 @us
	WHERE scope = $1 AND id = $2 AND expires_at <= now() AND state <> 'running'
	RETURNING created_at
), dropped AS (
	DELETE FROM idem_steps WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM taken)
)
SELECT (extract(epoch FROM created_at) * 1000000)::int8 FROM taken`),

		// A lease can only be taken from a run whose lease has expired and that still has the
		// token the taker saw: of two takers, one wins.
		takeover: r.Replace(`UPDATE idem_keys SET lease_token = $3, locked_until = now() + $5::int8 @us, attempts = attempts + 1
WHERE scope = $1 AND id = $2 AND state = 'running' AND locked_until <= now() AND lease_token IS NOT DISTINCT FROM $4
RETURNING attempts, input, (extract(epoch FROM created_at) * 1000000)::int8`),

		history: r.Replace(`SELECT seq, name, kind, output, error, attempts FROM idem_steps WHERE scope = $1 AND id = $2 ORDER BY seq`),

		// The fence: the step's row is written only if this process still holds the lease, in the
		// same transaction as the step's own writes. The UPDATE locks the run's row until COMMIT,
		// so a takeover waits for the step to commit or roll back and then sees the new history.
		// The checkpoint also renews the lease.
		checkpoint: r.Replace(`WITH fence AS (
	UPDATE idem_keys SET recovery_point = $5, locked_until = now() + $9::int8 @us
	WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'
	RETURNING 1
)
INSERT INTO idem_steps (scope, id, seq, name, kind, output, error, attempts)
SELECT $1, $2, $4, $5, $6, $7, $8, $10 FROM fence`),

		stepLookup: r.Replace(`SELECT output, error, attempts FROM idem_steps WHERE scope = $1 AND id = $2 AND seq = $3`),

		renew: r.Replace(`UPDATE idem_keys SET locked_until = now() + $4::int8 @us
WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`),

		finish: r.Replace(`UPDATE idem_keys SET state = $4, result = $5, lease_token = NULL, locked_until = NULL, last_error = NULL,
	expires_at = now() + $6::int8 @us
WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`),

		// Records why a run stopped, keeping the lease: the run is retried when the lease expires.
		stuck: r.Replace(`UPDATE idem_keys SET last_error = $4 WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'`),

		// SKIP LOCKED passes over runs whose owner is committing a step right now (its checkpoint
		// holds the row, and renews the lease), and over runs another scan is handling.
		scan: r.Replace(`SELECT scope, id, attempts, (extract(epoch FROM locked_until) * 1000000)::int8
FROM idem_keys WHERE state = 'running' AND locked_until <= now()
ORDER BY locked_until LIMIT $1 FOR UPDATE SKIP LOCKED`),

		inspect: r.Replace(`SELECT state, coalesce(workflow, ''), input, attempts, locked_until <= now(), lease_token,
	coalesce(extract(epoch FROM now() - locked_until), 0)::float8, coalesce(recovery_point, ''), coalesce(last_error, ''),
	(extract(epoch FROM created_at) * 1000000)::int8
FROM idem_keys WHERE scope = $1 AND id = $2`),

		reconcileEnd: r.Replace(`UPDATE idem_keys SET state = $4, result = $5, lease_token = NULL, locked_until = NULL,
	expires_at = now() + $6::int8 @us
WHERE scope = $1 AND id = $2 AND state = 'running' AND locked_until <= now() AND lease_token IS NOT DISTINCT FROM $3`),

		// Resuming later grants a new budget of attempts: the hook has looked at the run and
		// decided it deserves one.
		reconcileResume: r.Replace(`UPDATE idem_keys SET lease_token = NULL, locked_until = now() + $4::int8 @us, attempts = 0
WHERE scope = $1 AND id = $2 AND state = 'running' AND locked_until <= now() AND lease_token IS NOT DISTINCT FROM $3`),

		// Finished and expired only: a running row is never deleted, whatever its expiry. Steps
		// go with their key (ON DELETE CASCADE).
		reap: r.Replace(`DELETE FROM idem_keys k USING (
	SELECT scope, id FROM idem_keys WHERE expires_at <= now() AND state <> 'running'
	LIMIT $1 FOR UPDATE SKIP LOCKED
) doomed WHERE k.scope = doomed.scope AND k.id = doomed.id`),
	}
	actual, _ := statementCache.LoadOrStore(schema, s)
	return actual.(*statements)
}
