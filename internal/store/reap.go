package store

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// reapStatements are the texts of the statements that delete what has expired, in short
// batches.
type reapStatements struct {
	keys, runs, outbox string
}

func newReapStatements(t Tables) reapStatements {
	return reapStatements{
		// The rows are found on the expiry index, locked, and deleted by their ctid: a row locked
		// by this statement cannot move before it is deleted, and a TID scan goes straight to
		// its heap page. A join back on the primary key instead costs a B-tree descent per row,
		// and past a few thousand rows the planner turns it into a hash join over a sequential
		// scan of the whole table (5,000 rows of 300,000: 250 ms against 55 ms). The scan starts
		// at the expiry where the last batch ended ($2): from the index's left edge it would
		// step over the entries of every row deleted before, until a vacuum removes them (20 ms
		// a batch, half of it, 750,000 rows into a backlog of 1,000,000). expires_at < 'infinity'
		// is idem_keys_expires_at's predicate, which a run's key (whose run's reaper deletes it)
		// is left out of: said here, the planner may use the index.
		keys: t.render(`WITH gone AS (
	DELETE FROM {keys} WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM {keys} WHERE expires_at <= now() AND expires_at < 'infinity'
			AND expires_at >= coalesce($2::timestamptz, '-infinity')
		ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))
	RETURNING expires_at
)
SELECT count(*), max(expires_at) FROM gone`),

		// A finished child whose parent is unfinished is kept, since the parent may still wait
		// for its outcome: it is looked at again when it is twice as old (so a child of a parent
		// that runs for months costs a few updates), and goes at the first look after its
		// parent has finished (its new expiry is past the cursor). The scan starts at the
		// expiry where the last batch ended ($2), as the keys' does.
		runs: t.render(`WITH due AS (
	SELECT scope, id, parent_scope, parent_id, expires_at FROM {runs}
	WHERE expires_at <= now() AND expires_at >= coalesce($2::timestamptz, '-infinity')
	ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
), held AS (
	UPDATE {runs} r SET expires_at = now() + greatest(now() - coalesce(r.finished_at, r.updated_at), interval '1 second')
	FROM due d WHERE r.scope = d.scope AND r.id = d.id AND d.parent_id IS NOT NULL AND EXISTS (
		SELECT FROM {runs} p WHERE p.scope = d.parent_scope AND p.id = d.parent_id AND p.state NOT IN ` + finishedStates + `)
	RETURNING r.scope, r.id
), doomed AS (
	SELECT scope, id FROM due d WHERE NOT EXISTS (SELECT FROM held h WHERE h.scope = d.scope AND h.id = d.id)
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
SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM due), (SELECT max(expires_at) FROM due)`),

		// The scan starts after the id where the last batch ended ($3), for the reason the keys'
		// does: from the index's left edge, every batch would step over the entries of every
		// message deleted before it until a vacuum removes them (a reap of 120,000 messages
		// took from under a second to a minute, as it happened to find them marked dead or not).
		outbox: t.render(`WITH doomed AS (
	SELECT id FROM {outbox}
	WHERE id < (lpad(to_hex((extract(epoch FROM now() - $2::int8 @us) * 1000)::int8), 12, '0') || '70000000000000000000')::uuid
		AND id > coalesce($3::uuid, '00000000-0000-0000-0000-000000000000')
		AND (published_at < now() - $2::int8 @us OR (status = 'skipped' AND created_at < now() - $2::int8 @us))
	ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM {outbox} o USING doomed d WHERE o.id = d.id RETURNING o.id, o.key, o.seq
), keys AS (
	DELETE FROM {outbox_keys} k WHERE k.key IN (
		SELECT kk.key FROM {outbox_keys} kk JOIN gone g ON g.key = kk.key AND g.seq = kk.seq FOR UPDATE OF kk SKIP LOCKED)
)
SELECT count(*), (SELECT id FROM gone ORDER BY id DESC LIMIT 1) FROM gone`),
	}
}

// ReapKeys deletes up to limit of idem.Do's expired keys, oldest expiry first from after (nil:
// from the oldest), and returns how many it deleted and the latest expiry among them, where the
// next batch can start (nil when it deleted none). A run's key never matches: its expiry is
// 'infinity'. SKIP LOCKED lets concurrent reapers share the work without waiting for each other,
// and passes over a key that a Do is replacing right now; a key passed over behind the cursor is
// left to the next call.
func (st *Statements) ReapKeys(ctx context.Context, q Querier, limit int, after *time.Time) (n int64, last *time.Time, err error) {
	err = q.QueryRow(ctx, st.reap.keys, limit, after).Scan(&n, &last)
	return n, last, err
}

// ReapRuns deletes up to limit finished, expired runs with their steps, attempts, keys, signals
// and events, and returns how many runs it deleted. A running or waiting run has no expiry and is
// never deleted.
//
// looked counts the runs it looked at, deleted or kept (a finished child whose parent is
// unfinished): a batch that kept some is full all the same. The scan starts at the expiry after
// (nil: from the oldest), and last is the latest expiry among the runs it looked at, where the next
// batch can start (nil when there were none); a run passed over behind the cursor is left to the
// next call.
func (st *Statements) ReapRuns(ctx context.Context, q Querier, limit int, after *time.Time) (n, looked int64, last *time.Time, err error) {
	err = q.QueryRow(ctx, st.reap.runs, limit, after).Scan(&n, &looked, &last)
	return n, looked, last, err
}

// ReapOutbox deletes up to limit outbox messages published (or skipped by an operator) longer
// than retention µs ago, oldest id first, and returns how many it deleted; dead-lettered and
// stopped messages wait for an operator. The ids are UUIDv7, so the scan is a range of the
// primary key that ends at the retention's time (made from the database's clock). A key's row
// goes with its newest message, unless a writer holds it right now. The scan starts after the
// id after (nil: from the oldest), and last is the newest id deleted, where the next batch can
// start (nil when it deleted none); a message passed over behind the cursor (held by another
// reaper, or published late) is left to the next call.
func (st *Statements) ReapOutbox(ctx context.Context, q Querier, limit int, retentionUS int64, after *uuid.UUID) (n int64, last *uuid.UUID, err error) {
	err = q.QueryRow(ctx, st.reap.outbox, limit, retentionUS, after).Scan(&n, &last)
	return n, last, err
}
