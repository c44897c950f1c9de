package store

import "context"

// reapStatements are the texts of the statements that delete what has expired, in short
// batches.
type reapStatements struct {
	keys, runs, outbox string
}

func newReapStatements(t Tables) reapStatements {
	return reapStatements{
		// expires_at < 'infinity' is idem_keys_expires_at's predicate, which a run's key (whose
		// run's reaper deletes it) is left out of: said here, the planner may use the index.
		keys: t.render(`DELETE FROM {keys} k USING (
	SELECT scope, id FROM {keys} WHERE expires_at <= now() AND expires_at < 'infinity' ORDER BY expires_at LIMIT $1
	FOR UPDATE SKIP LOCKED
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

		outbox: t.render(`WITH doomed AS (
	SELECT id FROM {outbox}
	WHERE id < (lpad(to_hex((extract(epoch FROM now() - $2::int8 @us) * 1000)::int8), 12, '0') || '70000000000000000000')::uuid
		AND (published_at < now() - $2::int8 @us OR (status = 'skipped' AND created_at < now() - $2::int8 @us))
	ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM {outbox} o USING doomed d WHERE o.id = d.id RETURNING o.key, o.seq
), keys AS (
	DELETE FROM {outbox_keys} k WHERE k.key IN (
		SELECT kk.key FROM {outbox_keys} kk JOIN gone g ON g.key = kk.key AND g.seq = kk.seq FOR UPDATE OF kk SKIP LOCKED)
)
SELECT count(*) FROM gone`),
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

// ReapOutbox deletes up to limit outbox messages published (or skipped by an operator) longer
// than retention µs ago, oldest id first, and returns how many it deleted; dead-lettered and
// stopped messages wait for an operator. The ids are UUIDv7, so the scan is a range of the
// primary key that ends at the retention's time (made from the database's clock). A key's row
// goes with its newest message, unless a writer holds it right now.
func (st *Statements) ReapOutbox(ctx context.Context, q Querier, limit int, retentionUS int64) (n int64, err error) {
	err = q.QueryRow(ctx, st.reap.outbox, limit, retentionUS).Scan(&n)
	return n, err
}
