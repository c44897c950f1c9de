package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// RunQueued is the state of a run that waits for a slot of its concurrency key: it holds
// nothing, and the transaction that ends an active run of its key starts it, oldest first.
const RunQueued RunState = "queued"

// activeStates is the SQL list of the states that hold a slot of a concurrency key.
const activeStates = `('running', 'sleeping', 'awaiting')`

// concurrencyStatements are the texts of the statements for per-key concurrency. Each runs after
// the key's lock (ConcurrencyLockID, taken by a statement of its own before it, so that its
// snapshot sees every run that committed while the lock was awaited).
type concurrencyStatements struct {
	lock, admitStart, admit, of string
}

func newConcurrencyStatements(t Tables) concurrencyStatements {
	return concurrencyStatements{
		lock: `SELECT pg_advisory_xact_lock($1)`,

		// A run just started in this transaction keeps running when its key has a free slot
		// and no older run waits for one; otherwise it is queued.
		admitStart: t.render(`WITH active AS (
	SELECT count(*) AS n FROM {runs}
	WHERE workflow = $3 AND concurrency_key = $4 AND state IN ` + activeStates + ` AND NOT (scope = $1 AND id = $2)
), queued AS (
	UPDATE {runs} SET state = 'queued', attempts = 0, lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
		updated_at = {now}
	WHERE scope = $1 AND id = $2 AND ((SELECT n FROM active) >= $5 OR EXISTS (
		SELECT FROM {runs} WHERE workflow = $3 AND concurrency_key = $4 AND state = 'queued' AND NOT (scope = $1 AND id = $2)))
	RETURNING 1
)
SELECT NOT EXISTS (SELECT FROM queued)`),

		// Starts the oldest queued runs of a key, as many as its free slots (counted without the
		// run $3/$4 that is ending in this transaction), ownerless: their resume jobs take them.
		admit: t.render(`WITH active AS (
	SELECT count(*) AS n FROM {runs}
	WHERE workflow = $1 AND concurrency_key = $2 AND state IN ` + activeStates + ` AND NOT (scope = $3 AND id = $4)
), head AS (
	SELECT concurrency_limit AS lim FROM {runs} WHERE workflow = $1 AND concurrency_key = $2 AND state = 'queued'
	ORDER BY created_at, scope, id LIMIT 1
), next AS (
	SELECT scope, id FROM {runs} WHERE workflow = $1 AND concurrency_key = $2 AND state = 'queued'
	ORDER BY created_at, scope, id
	LIMIT greatest(0, coalesce((SELECT lim FROM head), 0) - (SELECT n FROM active))
	FOR UPDATE
)
UPDATE {runs} r SET state = 'running', lease_expires_at = {now}, updated_at = {now}
FROM next WHERE r.scope = next.scope AND r.id = next.id
RETURNING r.scope, r.id, (extract(epoch FROM r.lease_expires_at) * 1000000)::int8`),

		of: t.render(`SELECT workflow, concurrency_key, coalesce(concurrency_limit, 0) FROM {runs}
WHERE scope = $1 AND id = $2 AND concurrency_key IS NOT NULL`),
	}
}

// ConcurrencyLockID is the advisory lock of a workflow's concurrency key: the first 8 bytes of a
// SHA-256 over the schema, the workflow and the key, apart from the keys' in-flight locks.
func ConcurrencyLockID(schema, workflow, key string) int64 {
	return lockHash("idem.concurrency.v1", LockSchema(schema), workflow, key)
}

// ConcurrencyLock takes the lock of a workflow's concurrency key for the rest of the caller's
// transaction, waiting for it: every decision about the key's slots is made under it.
func (st *Statements) ConcurrencyLock(ctx context.Context, q Querier, workflow, key string) error {
	_, err := q.Exec(ctx, st.concurrency.lock, ConcurrencyLockID(st.schema, workflow, key))
	return err
}

// ConcurrencyLockStmt is ConcurrencyLock as a statement for a batch.
func (st *Statements) ConcurrencyLockStmt(workflow, key string) Stmt {
	return Stmt{SQL: st.concurrency.lock, Args: []any{ConcurrencyLockID(st.schema, workflow, key)}}
}

// RunAdmitStartStmt decides, under the key's lock, whether the run scope/id just started (or
// reopened) in the caller's transaction may run: when its key has no free slot, or an older run
// waits for one, the run is queued instead. ScanAdmitted reads the answer.
func (st *Statements) RunAdmitStartStmt(scope, id, workflow string, c Concurrency) Stmt {
	return Stmt{SQL: st.concurrency.admitStart, Args: []any{scope, id, workflow, c.Key, c.Limit}}
}

// ScanAdmitted reads RunAdmitStart's answer: true when the run may run.
func ScanAdmitted(row pgx.Row) (admitted bool, err error) {
	err = row.Scan(&admitted)
	return admitted, err
}

// Admitted is a queued run that RunAdmit started, ownerless, with its lease's expiry in µs (the
// generation of its resume job).
type Admitted struct {
	Scope, ID  string
	Generation int64
}

// RunAdmit starts, under the key's lock, the oldest queued runs of a workflow's concurrency key,
// as many as its free slots, counted without the run ending/endingID that ends in the caller's
// transaction ("" for none). The caller inserts their resume jobs in the same transaction.
func (st *Statements) RunAdmit(ctx context.Context, q Querier, workflow, key, endingScope, endingID string) ([]Admitted, error) {
	rows, err := q.Query(ctx, st.concurrency.admit, workflow, key, endingScope, endingID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Admitted, error) {
		var a Admitted
		err := r.Scan(&a.Scope, &a.ID, &a.Generation)
		return a, err
	})
}

// RunConcurrency reads a run's workflow and concurrency key and limit; ok is false when it has no
// key (or there is no run).
func (st *Statements) RunConcurrency(ctx context.Context, q Querier, scope, id string) (workflow string, c Concurrency, ok bool, err error) {
	err = q.QueryRow(ctx, st.concurrency.of, scope, id).Scan(&workflow, &c.Key, &c.Limit)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", Concurrency{}, false, nil
	}
	return workflow, c, err == nil, err
}
