package idem

import (
	"hash/fnv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// statements holds the SQL that Do and Run send, for one schema. Built once per schema and
// kept, so the text is identical on every call and pgx's statement cache prepares it once per
// connection.
type statements struct {
	lookup  string
	insert  string
	replace string
}

var statementCache sync.Map // schema name -> *statements

func statementsFor(schema string) *statements {
	if s, ok := statementCache.Load(schema); ok {
		return s.(*statements)
	}
	keys, steps := "idem_keys", "idem_steps"
	if schema != "" {
		keys, steps = pgx.Identifier{schema, keys}.Sanitize(), pgx.Identifier{schema, steps}.Sanitize()
	}
	r := strings.NewReplacer("idem_keys", keys, "idem_steps", steps)
	s := &statements{
		// One row whatever happens, thanks to the outer join against a one-row relation. The
		// advisory lock is taken only when the key is not already done: replays never contend
		// with each other, and pg_try_ never waits, so a duplicate is answered at once instead of
		// parking a connection on a lock.
		lookup: r.Replace(`SELECT k.state, k.workflow, k.fingerprint, k.result, k.expires_at > now(),
	CASE WHEN k.state = 'done' AND k.expires_at > now() THEN true ELSE pg_try_advisory_xact_lock($3) END,
	ceil(extract(epoch FROM k.locked_until - now()))::int4
FROM (SELECT) AS one LEFT JOIN idem_keys k ON k.scope = $1 AND k.id = $2`),

		// The TTL counts from this write, not from the transaction's start (now()), so that a
		// transaction longer than the TTL cannot store a key that is already expired.
		//
		// A plain INSERT on purpose: if a racing duplicate committed this key after our snapshot
		// was taken, the unique index rejects the write and the transaction aborts, so neither
		// our effects nor our result can commit beside the other's.
		insert: r.Replace(`INSERT INTO idem_keys (scope, id, fingerprint, result, expires_at)
VALUES ($1, $2, $3, $4, statement_timestamp() + $5::int8 * interval '1 microsecond')`),

		// The key existed but had expired (a result of Do, or a finished workflow). Replace it only
		// if it is still expired when the UPDATE gets to it; if it is not (a racer renewed it), or it is gone (the reaper deleted it),
		// fall through to the INSERT, which either takes the free key or aborts on the racer's row.
		replace: r.Replace(`WITH replaced AS (
	UPDATE idem_keys SET state = 'done', fingerprint = $3, result = $4, workflow = NULL, input = NULL,
		recovery_point = NULL, lease_token = NULL, locked_until = NULL, attempts = 0,
		created_at = now(), expires_at = statement_timestamp() + $5::int8 * interval '1 microsecond'
	WHERE scope = $1 AND id = $2 AND expires_at <= now() AND state <> 'running'
	RETURNING 1
), cleared AS (
	-- An expired workflow's history goes with it: the key now names another operation.
	DELETE FROM idem_steps WHERE scope = $1 AND id = $2 AND EXISTS (SELECT FROM replaced)
)
INSERT INTO idem_keys (scope, id, fingerprint, result, expires_at)
SELECT $1::text, $2::text, $3::bytea, $4::bytea, statement_timestamp() + $5::int8 * interval '1 microsecond'
WHERE NOT EXISTS (SELECT FROM replaced)`),
	}
	actual, _ := statementCache.LoadOrStore(schema, s)
	return actual.(*statements)
}

// lockID maps a key to the 64-bit advisory lock that marks it in flight. The schema is part of
// it so that two idem installations in one database do not block each other. A collision
// between two keys costs a spurious ErrInFlight, never a wrong answer: the row, not the lock,
// decides what is stored.
func lockID(schema string, k Key) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem\x00"))
	h.Write([]byte(schema))
	h.Write([]byte{0})
	h.Write([]byte(k.Scope))
	h.Write([]byte{0})
	h.Write([]byte(k.ID))
	return int64(h.Sum64())
}
