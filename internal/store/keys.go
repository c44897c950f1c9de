package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// keyStatements are the texts of idem.Do's statements on idem_keys; see the function of each.
type keyStatements struct {
	lookup, insert, replace, runKey, clearRun string

	// The same writes for a result over PayloadInlineMax, which goes to idem_results.
	insertLarge, replaceLarge string
}

// resultsFamily is idem_results: Do's large results, by the UTC day their key expires on. Once
// that day and one more (for the clocks of the writers and the reaper, which are one database's,
// and for a transaction that wrote near midnight) have passed, every key that points into the
// partition has expired: its key is free again, and its result is neither replayed nor read.
var resultsFamily = payloadFamily{
	base:      "idem_results",
	table:     func(t Tables) string { return t.Results },
	ahead:     14,
	droppable: `SELECT $1::date + 2 <= ` + utcDay("now()"),
}

// largeResult is the head of the statements that store a large result: the key's expiry, and
// the day of the partition its result goes to, stored there by idem_result_put under the key
// row's created_at (the same statement_timestamp(), which tells it from a row an earlier key of
// the same name left there), or NULL when that partition does not exist, and the result stays in
// the key's row. idem_result_put inserts into the partition by name: an INSERT through
// idem_results would route rows with the partitions it knew when it started, and fail if the
// one for its day was attached meanwhile. The result's row is written before the key's; a
// duplicate that committed the key first fails on idem_keys_pkey (or, in the same microsecond,
// on its partition's primary key: IsKeyTaken knows both), which aborts the transaction.
func largeResult(t Tables) string {
	day := utcDay("v.expires_at")
	return `WITH v AS (
	SELECT statement_timestamp() + $5::int8 @us AS expires_at
), p AS MATERIALIZED (
	SELECT v.expires_at, CASE WHEN ` + t.qualify("idem_result_put") + `(` + t.partitionNameSQL("idem_results", day) + `, ` + day +
		`, $1, $2, statement_timestamp(), $4) THEN ` + day + ` END AS day FROM v
)`
}

func newKeyStatements(t Tables) keyStatements {
	return keyStatements{
		// One row whatever happens, thanks to the outer join against a one-row relation.
		// pg_try_ never waits, so a duplicate is answered at once instead of parking a
		// connection on a lock, and replays never contend with each other.
		// A large result is read from the one partition result_day names, by idem_result_data,
		// and only for a live key (a replay): joining the partitioned table here would cost
		// every lookup a plan over, and a lock on, all of its partitions.
		lookup: t.render(`SELECT k.fingerprint,
	CASE WHEN k.result_day IS NULL THEN k.result WHEN k.expires_at > now() THEN ` + resultData(t, "k") + ` END,
	k.result_day, k.workflow, k.expires_at > now(),
	CASE WHEN k.expires_at > now() THEN true ELSE pg_try_advisory_xact_lock($3) END
FROM (SELECT) AS one LEFT JOIN {keys} k ON k.scope = $1 AND k.id = $2`),

		// The TTL counts from this write, not from the transaction's start, so that a
		// transaction longer than the TTL cannot store a key that is already expired. A plain
		// INSERT on purpose: if a racing duplicate committed this key after our snapshot was
		// taken, the primary key rejects the write and Postgres aborts the transaction, so
		// neither our effects nor our result can commit beside the other's.
		insert: t.render(`INSERT INTO {keys} (scope, id, fingerprint, result, created_at, expires_at)
VALUES ($1, $2, $3, $4, statement_timestamp(), statement_timestamp() + $5::int8 @us)`),

		// It replaces the row only if it is still expired when the UPDATE gets to it; if it is
		// not (a racer renewed it), or it is gone (the reaper deleted it), it falls through to an
		// INSERT, which either takes the free key or aborts on the racer's row.
		replace: t.render(`WITH replaced AS (
	UPDATE {keys} SET fingerprint = $3, result = $4, result_day = NULL, created_at = statement_timestamp(),
		expires_at = statement_timestamp() + $5::int8 @us
	WHERE scope = $1 AND id = $2 AND expires_at <= now() AND workflow IS NULL
	RETURNING 1
)
INSERT INTO {keys} (scope, id, fingerprint, result, created_at, expires_at)
SELECT $1, $2, $3, $4, statement_timestamp(), statement_timestamp() + $5::int8 @us
WHERE NOT EXISTS (SELECT FROM replaced)`),

		insertLarge: t.render(largeResult(t) + `
INSERT INTO {keys} (scope, id, fingerprint, result, result_day, created_at, expires_at)
SELECT $1, $2, $3, CASE WHEN p.day IS NULL THEN $4::bytea END, p.day, statement_timestamp(), p.expires_at FROM p`),

		replaceLarge: t.render(largeResult(t) + `, replaced AS (
	UPDATE {keys} k SET fingerprint = $3, result = CASE WHEN p.day IS NULL THEN $4::bytea END, result_day = p.day,
		created_at = statement_timestamp(), expires_at = p.expires_at
	FROM p WHERE k.scope = $1 AND k.id = $2 AND k.expires_at <= now() AND k.workflow IS NULL
	RETURNING 1
)
INSERT INTO {keys} (scope, id, fingerprint, result, result_day, created_at, expires_at)
SELECT $1, $2, $3, CASE WHEN p.day IS NULL THEN $4::bytea END, p.day, statement_timestamp(), p.expires_at FROM p
WHERE NOT EXISTS (SELECT FROM replaced)`),

		runKey: t.render(`SELECT pg_try_advisory_xact_lock($3),
	coalesce((SELECT expires_at <= now() FROM {runs} WHERE scope = $1 AND id = $2), false)`),

		clearRun: t.render(`WITH run AS (
	DELETE FROM {runs} WHERE scope = $1 AND id = $2 AND expires_at <= now() RETURNING 1
), steps AS (
	DELETE FROM {steps} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM run)
), attempts AS (
	DELETE FROM {attempts} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM run)
), signals AS (
	DELETE FROM {signals} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM run)
), events AS (
	DELETE FROM {events} WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM run)
)
DELETE FROM {keys} WHERE scope = $1 AND id = $2 AND workflow IS NOT NULL AND EXISTS (SELECT FROM run)`),
	}
}

// KeyRow is a key as KeyLookup reads it.
type KeyRow struct {
	Found       bool
	Fingerprint []byte
	Result      []byte     // a large one (ResultDay set) is read only while the key is live
	ResultDay   *time.Time // set when the result is in idem_results, in this day's partition
	Workflow    *string    // set when the key belongs to a run
	Live        bool       // not expired
	Locked      bool       // this transaction holds the key's lock (or needed none: a live result)
}

// KeyLookup reads a key and, unless it holds a live result, takes the transaction-scoped
// advisory lock that marks it in flight (lock, the key's LockID), without waiting: Locked is
// false when another transaction holds it. Found is false when there is no such key.
func (st *Statements) KeyLookup(ctx context.Context, q Querier, scope, id string, lock int64) (KeyRow, error) {
	var (
		row  KeyRow
		live *bool
	)
	err := q.QueryRow(ctx, st.keys.lookup, scope, id, lock).Scan(&row.Fingerprint, &row.Result, &row.ResultDay, &row.Workflow, &live, &row.Locked)
	if err != nil {
		return KeyRow{}, err
	}
	if live != nil {
		row.Found, row.Live = true, *live
	}
	return row, nil
}

// KeyStoreParams are a result of idem.Do's to store under its key, kept for TTL from the write.
type KeyStoreParams struct {
	Scope, ID   string
	Fingerprint []byte
	Result      []byte
	TTL         time.Duration
}

func (p KeyStoreParams) args() []any {
	return []any{p.Scope, p.ID, p.Fingerprint, p.Result, micros(p.TTL)}
}

// KeyInsert stores a result under a new key. When another transaction committed the key first,
// it fails with a unique violation on idem_keys_pkey (IsKeyTaken), which aborts the
// transaction: it may go with COMMIT. A result over PayloadInlineMax bytes goes to the partition
// of idem_results for the day the key expires, when there is one.
func (st *Statements) KeyInsert(p KeyStoreParams) Stmt {
	if large(len(p.Result)) {
		return Stmt{SQL: st.keys.insertLarge, Args: p.args()}
	}
	return Stmt{SQL: st.keys.insert, Args: p.args()}
}

// KeyReplace stores a result under a key of Do's that had expired, as KeyInsert does a new one:
// it rewrites the row if it is still expired, and inserts it if the reaper deleted it meanwhile.
func (st *Statements) KeyReplace(p KeyStoreParams) Stmt {
	if large(len(p.Result)) {
		return Stmt{SQL: st.keys.replaceLarge, Args: p.args()}
	}
	return Stmt{SQL: st.keys.replace, Args: p.args()}
}

// resultData is the SQL of the large result of the key row aliased k: idem_result_data on the
// partition of idem_results its result_day names (NULL when it is gone).
func resultData(t Tables, k string) string { return resultCall(t, "idem_result_data", k) }

// resultSize is the SQL of the size of that result, read without the result.
func resultSize(t Tables, k string) string { return resultCall(t, "idem_result_size", k) }

func resultCall(t Tables, fn, k string) string {
	return t.qualify(fn) + "(" + t.partitionNameSQL("idem_results", k+".result_day") + ", " +
		k + ".result_day, " + k + ".scope, " + k + ".id, " + k + ".created_at)"
}

// IsKeyTaken reports whether err is KeyInsert's or KeyReplace's failure on a key that another
// transaction committed first.
func IsKeyTaken(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return false
	}
	c := pgErr.ConstraintName
	return c == "idem_keys_pkey" || (strings.HasPrefix(c, "idem_results_p") && strings.HasSuffix(c, "_pkey"))
}

// RunKeyRow is what KeyRunKey found of a key that belongs to a run.
type RunKeyRow struct {
	Locked   bool // this transaction took the key's in-flight lock
	Reusable bool // the run has finished and expired
}

// KeyRunKey takes a run's key's in-flight lock (lock, its LockID) without waiting, and says
// whether the run has finished and expired, so that idem.Do may take the key over.
func (st *Statements) KeyRunKey(ctx context.Context, q Querier, scope, id string, lock int64) (RunKeyRow, error) {
	var r RunKeyRow
	err := q.QueryRow(ctx, st.keys.runKey, scope, id, lock).Scan(&r.Locked, &r.Reusable)
	return r, err
}

// KeyClearRun deletes a finished, expired run with its steps, attempts, signals, events and key,
// so that idem.Do can insert the key afresh. It deletes nothing if the run is not expired by the
// time it gets to it.
func (st *Statements) KeyClearRun(ctx context.Context, q Querier, scope, id string) error {
	_, err := q.Exec(ctx, st.keys.clearRun, scope, id)
	return err
}

// LockID maps a key to the 64-bit advisory lock that marks it in flight: the first 8 bytes of a
// SHA-256 over the schema and the key. A cryptographic hash, so that a client who knows another
// tenant's key cannot craft one of its own that collides with it and so keep it "in flight"; a
// collision costs a spurious in-flight answer, never a wrong one, since the row, not the lock,
// decides what is stored. The schema is part of it so that two installations of idem in one
// database do not block each other. Do and workflow runs take the same lock for a key.
//
// The schema goes in as Postgres resolves it ([LockSchema]), so that two spellings of one
// schema take one lock: a lock per spelling would let two Do's on one key both run their
// function.
func LockID(schema, scope, id string) int64 {
	return lockHash("idem.lock.v1", LockSchema(schema), scope, id)
}

// lockHash is the first 8 bytes of a SHA-256 over the length-prefixed parts, so that parts never
// run into each other.
func lockHash(parts ...string) int64 {
	h := sha256.New()
	var n [8]byte
	for _, part := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])))
}

// LockSchema is the schema as it names a table: what Postgres makes of the identifier TablesIn
// quotes. pgx drops NUL bytes from it, and Postgres cuts it to 63 bytes (NAMEDATALEN - 1) at a
// character boundary. "public", where the default search_path finds idem's tables, is "" (the
// unqualified default), so that the default keeps the lock ids it always had. An application
// whose search_path puts idem's tables elsewhere should name that schema (Schema option) in
// every call, as the documentation of the option asks, or the two spellings take two locks.
func LockSchema(schema string) string {
	schema = strings.ReplaceAll(schema, "\x00", "")
	if len(schema) > maxIdentifier {
		cut := maxIdentifier
		for cut > 0 && !utf8.RuneStart(schema[cut]) {
			cut--
		}
		schema = schema[:cut]
	}
	if schema == "public" {
		return ""
	}
	return schema
}

// maxIdentifier is the longest identifier Postgres keeps, in bytes.
const maxIdentifier = 63
