package store

import "context"

// reapStatements are the texts of the statements that delete what has expired, in short
// batches.
type reapStatements struct {
	keys, runs string
}

func newReapStatements(t Tables) reapStatements {
	return reapStatements{
		keys: t.render(`DELETE FROM {keys} k USING (
	SELECT scope, id FROM {keys} WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) doomed WHERE k.scope = doomed.scope AND k.id = doomed.id`),

		runs: t.render(`WITH doomed AS (
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

// ReapKeys deletes up to limit of idem.Do's expired keys, oldest expiry first, and returns how
// many it deleted. A run's key never matches: its expiry is 'infinity'. SKIP LOCKED lets
// concurrent reapers share the work without waiting for each other, and passes over a key that
// a Do is replacing right now.
func (st *Statements) ReapKeys(ctx context.Context, q Querier, limit int) (int64, error) {
	tag, err := q.Exec(ctx, st.reap.keys, limit)
	return tag.RowsAffected(), err
}

// ReapRuns deletes up to limit finished, expired runs with their steps, attempts, keys, signals
// and events, and returns how many runs it deleted. A running or waiting run has no expiry and is
// never deleted.
func (st *Statements) ReapRuns(ctx context.Context, q Querier, limit int) (n int64, err error) {
	err = q.QueryRow(ctx, st.reap.runs, limit).Scan(&n)
	return n, err
}
