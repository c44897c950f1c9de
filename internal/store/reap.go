package store

// ReapStatements delete what has expired, in short batches.
type ReapStatements struct {
	// Keys deletes up to $1 of Do's expired keys, oldest expiry first. A run's key never
	// matches: its expiry is 'infinity'. SKIP LOCKED lets concurrent reapers share the work
	// without waiting for each other, and passes over a key that a Do is replacing right now.
	Keys string

	// Runs deletes up to $1 finished, expired runs with their steps, attempts, keys, signals and events. A running run has
	// no expiry and is never deleted. Returns the number of runs deleted.
	Runs string
}

func reapStatements(t Tables) ReapStatements {
	return ReapStatements{
		Keys: t.render(`DELETE FROM {keys} k USING (
	SELECT scope, id FROM {keys} WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) doomed WHERE k.scope = doomed.scope AND k.id = doomed.id`),

		Runs: t.render(`WITH doomed AS (
	SELECT scope, id FROM {runs} WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
), runs AS (
	DELETE FROM {runs} r USING doomed d WHERE r.scope = d.scope AND r.id = d.id RETURNING r.scope, r.id
), steps AS (
	DELETE FROM {steps} s USING runs d WHERE s.scope = d.scope AND s.id = d.id
), attempts AS (
	DELETE FROM {attempts} a USING runs d WHERE a.scope = d.scope AND a.id = d.id
), keys AS (
	DELETE FROM {keys} k USING runs d WHERE k.scope = d.scope AND k.id = d.id AND k.workflow IS NOT NULL
), signals AS (
	DELETE FROM {signals} g USING runs d WHERE g.scope = d.scope AND g.id = d.id
), events AS (
	DELETE FROM {events} v USING runs d WHERE v.scope = d.scope AND v.id = d.id
)
SELECT count(*) FROM runs`),
	}
}
