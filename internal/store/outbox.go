package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// outboxStatements are package outbox's statements: appending messages, the relay's reads and
// writes, its lanes, and the operator's reads and fixes. Arguments are listed as $n = name.
type outboxStatements struct {
	// Append writes one message with a key: it takes the key's next sequence number with an
	// upsert that locks the key's row until the writer's transaction ends, so that a second
	// writer of the key waits and numbers its message after this one. The message's position
	// (the column's default) is taken after that lock, and the writer's xid before the position
	// (x feeds everything else), which the relay relies on: for one key, position order is
	// commit order, and a transaction that gets its xid after a relay's snapshot writes
	// positions past everything that snapshot saw. $1 id, $2 topic, $3 key, $4 hash, $5 payload, $6 headers (JSON text or NULL).
	Append string

	// AppendUnkeyed writes one message without a key: no sequence number, no lock.
	// $1 id, $2 topic, $3 hash, $4 payload, $5 headers.
	AppendUnkeyed string

	// appendLarge, appendUnkeyedLarge and appendBatchLarge are Append, AppendUnkeyed and
	// AppendBatch for messages with a body over PayloadInlineMax: the same arguments, and the
	// same writes, with the large bodies in their day's partition of idem_outbox_payloads when
	// it exists (see largeBody). OutboxAppend sends them only when a body is that large, so
	// that small messages are written by the statements above, unchanged.
	appendLarge, appendUnkeyedLarge, appendBatchLarge string

	// AppendBatch writes many messages in one statement. Keys' rows are upserted in key order, so
	// that two batches never lock each other's keys in opposite orders, and before any message
	// takes its position (the sort needs every row). Each key's row advances by its number of
	// messages; a message's seq is the key's new seq less $5 (how many of the key's messages
	// follow it in the batch). $1 ids, $2 topics, $3 keys ('' for none), $4
	// hashes, $5 followers, $6 payloads, $7 headers, $8 distinct keys, $9 their counts.
	AppendBatch string

	// Start reads where a relay begins: the highest position, with the snapshot it was read in
	// and the next xid.
	Start string

	// Fetch is the relay's read: the snapshot of the statement with the highest position it sees
	// and the next xid (see snapshotNow), then the unsettled messages of the live lanes past the
	// cursor in position order, then the unsettled messages, at or below the cursor, of
	// transactions that were in progress at earlier reads (they committed since): those listed
	// in $2, and every xid from $7 on (the last snapshot's xmax, above which in-progress
	// transactions are not listed). $1 cursor, $2 xids, $3 limit, $4 number of lanes, $5 live
	// lanes, $6 owned lanes, $7 lowest xid not listed.
	Fetch string

	// CatchUp reads a range of positions of some lanes, for a relay that took them over or was
	// asked to read them again. $1 from (excluded), $2 to (included), $3 limit, $4 number of
	// lanes, $5 lanes.
	CatchUp string

	// Write records what the relay learned (published, or a failed attempt), for the messages of
	// the lanes it still holds: it locks those lanes' rows FOR SHARE, so that a takeover waits for
	// it, and checks each lane's token and lease by the clock at that moment. $1 lanes, $2 their
	// tokens, $3 ids, $4 their lanes, $5 published, $6 attempts, $7 errors, $8 statuses. Returns
	// the lanes still held and how many messages were written.
	Write string

	// LanesInit creates lanes 0..$1-1 if there are none yet. Two relays that start at once both
	// insert; the second waits for the first's rows and skips them.
	LanesInit string

	// LanesCount counts the lanes; sent after LanesInit committed, it sees the lanes of a relay
	// that made them first.
	LanesCount string

	// Heartbeat renews this relay's row ($1 owner, $2 lease µs) and lists the live relays, this
	// one included, by name.
	Heartbeat string

	// Renew extends this relay's leases on the lanes whose tokens it still holds, records their
	// floors, and hands back and clears any rewind an operator asked for. $1 owner, $2 lanes,
	// $3 tokens, $4 floors, $5 lease µs. Returns lane, token, floor and rewind (0 for none), as
	// Acquire does.
	Renew string

	// Acquire takes up to $3 lanes that have no owner or whose lease ran out, with fresh tokens.
	// $1 owner, $2 lease µs. Returns lane, token, floor and rewind (cleared).
	Acquire string

	// Release gives lanes up, recording their floors. $1 owner, $2 lanes, $3 tokens, $4 floors.
	Release string

	// Leave deletes this relay's row. $1 owner.
	Leave string

	// Get reads a message. $1 id.
	Get string

	// SetStatus sets a message's status (NULL: the relay takes it up again, with its attempts
	// reset), if it is one of $3. $1 id, $2 status. Returns pos and hash.
	SetStatus string

	// Rewind asks the owner of a message's lane to read the lane again from the message's
	// position. $1 pos, $2 hash.
	Rewind string

	// Lanes reads the lanes, with the oldest unsettled message of each, for operators.
	Lanes string

	// Counts counts the messages by status (pending, published, stopped, dead, skipped). It reads
	// the whole table.
	Counts string

	// list statements, by status filter; see OutboxList.
	listAttention, listStatus, listPending, listPublished, listAll string
}

// outboxColumns are what an OutboxRow scans, in order.
const outboxColumns = `pos, id, topic, key, coalesce(seq, 0), hash, payload, payload_day, headers,
	(extract(epoch FROM created_at) * 1000000)::int8, published_at, attempts, coalesce(last_error, ''), coalesce(status, '')`

// snapshotNow is the statement's snapshot, the database's clock in µs, and the next xid to be
// assigned (read after the snapshot was taken, so an upper bound of the xids assigned before it).
// A snapshot's xmax is not that: it is one past the latest completed xid, and a transaction
// that began earlier but holds a higher xid is in progress without being listed. age() of a
// transaction without an xid counts from the next xid, which gives it without assigning one.
const snapshotNow = `SELECT s::text AS snap, (extract(epoch FROM now()) * 1000000)::int8 AS now,
	CASE WHEN m % 4294967296 >= 3 THEN m + age((m % 4294967296)::text::xid) ELSE pg_snapshot_xmax(s)::text::int8 END AS next
FROM (SELECT pg_current_snapshot() AS s) c, LATERAL (SELECT pg_snapshot_xmin(c.s)::text::int8 AS m) x`

// unsettled is a message the relay still has to publish: not published, not set aside.
const unsettled = `published_at IS NULL AND (status IS NULL OR status = 'stopped')`

func newOutboxStatements(t Tables) outboxStatements {
	const xid = `WITH x AS MATERIALIZED (SELECT pg_current_xact_id() AS xid)`
	list := func(where string) string {
		return t.render(`SELECT ` + outboxColumns + ` FROM {outbox} WHERE pos > $1 AND ` + where +
			` AND ($2 = '' OR topic = $2) AND ($3 = '' OR key = $3) ORDER BY pos LIMIT $4`)
	}
	keyed := `, k AS (
	INSERT INTO {outbox_keys} AS k (key, seq) SELECT $3, 1 FROM x
	ON CONFLICT (key) DO UPDATE SET seq = k.seq + 1
	RETURNING seq
)`
	batchKeys := `, k AS (
	INSERT INTO {outbox_keys} AS k (key, seq)
	SELECT u.key, u.n FROM x, unnest($8::text[], $9::int8[]) AS u(key, n) ORDER BY u.key
	ON CONFLICT (key) DO UPDATE SET seq = k.seq + excluded.seq
	RETURNING key, seq
)`
	batchRows := `unnest($1::uuid[], $2::text[], $3::text[], $4::int4[], $5::int8[], $6::bytea[], $7::text[])
	WITH ORDINALITY AS u(id, topic, key, hash, followers, payload, headers, n)`
	// Which bodies of a batch move is decided here by PayloadInlineMax itself: a threshold set
	// by SetPayloadInlineMax only decides which statement is sent.
	large := `octet_length(u.payload) > ` + strconv.Itoa(PayloadInlineMax)
	return outboxStatements{
		appendLarge: t.render(xid + largeBodyOne(t, `$1::uuid`, `$5::bytea`) + keyed + `
INSERT INTO {outbox} (id, xid, topic, key, seq, hash, payload, payload_day, headers)
SELECT $1, x.xid, $2, $3, k.seq, $4, CASE WHEN p.day IS NULL THEN $5::bytea END, p.day, $6::jsonb FROM k, x, p`),

		appendUnkeyedLarge: t.render(xid + largeBodyOne(t, `$1::uuid`, `$4::bytea`) + `
INSERT INTO {outbox} (id, xid, topic, key, hash, payload, payload_day, headers)
SELECT $1, x.xid, $2, '', $3, CASE WHEN p.day IS NULL THEN $4::bytea END, p.day, $5::jsonb FROM x, p`),

		appendBatchLarge: t.render(xid + largeBody(t,
			`ARRAY(SELECT u.id FROM unnest($1::uuid[], $6::bytea[]) AS u(id, payload) WHERE `+large+`)`,
			`ARRAY(SELECT u.payload FROM unnest($6::bytea[]) AS u(payload) WHERE `+large+`)`) + batchKeys + `
INSERT INTO {outbox} (id, xid, topic, key, seq, hash, payload, payload_day, headers)
SELECT u.id, x.xid, u.topic, u.key, k.seq - u.followers, u.hash,
	CASE WHEN p.day IS NULL OR NOT ` + large + ` THEN u.payload END, CASE WHEN ` + large + ` THEN p.day END, u.headers::jsonb
FROM x CROSS JOIN p CROSS JOIN ` + batchRows + `
LEFT JOIN k ON k.key = u.key
ORDER BY u.n`),

		Append: t.render(xid + keyed + `
INSERT INTO {outbox} (id, xid, topic, key, seq, hash, payload, headers)
SELECT $1, x.xid, $2, $3, k.seq, $4, $5, $6::jsonb FROM k, x`),

		AppendUnkeyed: t.render(xid + `
INSERT INTO {outbox} (id, xid, topic, key, hash, payload, headers)
SELECT $1, x.xid, $2, '', $3, $4, $5::jsonb FROM x`),

		AppendBatch: t.render(xid + batchKeys + `
INSERT INTO {outbox} (id, xid, topic, key, seq, hash, payload, headers)
SELECT u.id, x.xid, u.topic, u.key, k.seq - u.followers, u.hash, u.payload, u.headers::jsonb
FROM x CROSS JOIN ` + batchRows + `
LEFT JOIN k ON k.key = u.key
ORDER BY u.n`),

		Start: t.render(`WITH s AS MATERIALIZED (` + snapshotNow + `)
SELECT coalesce((SELECT max(pos) FROM {outbox}), 0), s.snap, s.next FROM s`),

		Fetch: t.render(`WITH s AS MATERIALIZED (` + snapshotNow + `)
SELECT 0, s.snap, s.now, (SELECT coalesce(max(pos), 0) FROM {outbox}), NULL::uuid, '', '', s.next, 0, NULL::bytea, NULL::date, NULL::jsonb, 0::int8, NULL::timestamptz, 0, '', '' FROM s
UNION ALL
(SELECT 1, '', 0, ` + outboxColumns + ` FROM {outbox}
	WHERE pos > $1 AND ` + unsettled + ` AND hash % $4 = ANY($5::int4[]) ORDER BY pos LIMIT $3)
UNION ALL
SELECT 2, '', 0, ` + outboxColumns + ` FROM {outbox}
	WHERE (xid = ANY($2::int8[]::text[]::xid8[]) OR xid >= $7::int8::text::xid8) AND pos <= $1 AND ` + unsettled + `
		AND hash % $4 = ANY($6::int4[])`),

		CatchUp: t.render(`SELECT ` + outboxColumns + `, (extract(epoch FROM now()) * 1000000)::int8 FROM {outbox}
WHERE pos > $1 AND pos <= $2 AND ` + unsettled + ` AND hash % $4 = ANY($5::int4[]) ORDER BY pos LIMIT $3`),

		Write: t.render(`WITH held AS (
	SELECT l.lane FROM {outbox_lanes} l JOIN unnest($1::int4[], $2::uuid[]) AS h(lane, token) ON l.lane = h.lane AND l.token = h.token
	WHERE l.expires_at > clock_timestamp()
	FOR SHARE OF l
), w AS (
	UPDATE {outbox} o SET published_at = CASE WHEN m.published THEN now() END, attempts = m.attempts,
		last_error = nullif(m.err, ''), status = nullif(m.status, '')
	FROM unnest($3::uuid[], $4::int4[], $5::bool[], $6::int4[], $7::text[], $8::text[]) AS m(id, lane, published, attempts, err, status)
	WHERE o.id = m.id AND m.lane IN (SELECT lane FROM held) AND o.published_at IS NULL
	RETURNING 1
)
SELECT coalesce((SELECT array_agg(lane) FROM held), '{}'), (SELECT count(*) FROM w)`),

		LanesInit: t.render(`INSERT INTO {outbox_lanes} (lane) SELECT generate_series(0, $1 - 1) WHERE NOT EXISTS (SELECT FROM {outbox_lanes})
ON CONFLICT DO NOTHING`),

		LanesCount: t.render(`SELECT count(*) FROM {outbox_lanes}`),

		Heartbeat: t.render(`WITH me AS (
	INSERT INTO {outbox_relays} (owner, expires_at) VALUES ($1, now() + $2::int8 @us)
	ON CONFLICT (owner) DO UPDATE SET expires_at = excluded.expires_at
), gone AS (
	DELETE FROM {outbox_relays} WHERE expires_at < now() - interval '1 hour'
)
SELECT array(SELECT owner FROM {outbox_relays} WHERE expires_at > now() AND owner <> $1 UNION SELECT $1 ORDER BY 1)`),

		Renew: t.render(`WITH mine AS (
	SELECT l.lane, l.rewind, h.floor FROM {outbox_lanes} l
	JOIN unnest($2::int4[], $3::uuid[], $4::int8[]) AS h(lane, token, floor) ON l.lane = h.lane AND l.token = h.token
	WHERE l.owner = $1
	FOR UPDATE OF l
)
UPDATE {outbox_lanes} l SET expires_at = now() + $5::int8 @us, rewind = NULL, floor = greatest(mine.floor, 0)
FROM mine WHERE l.lane = mine.lane
RETURNING l.lane, l.token, l.floor, coalesce(mine.rewind, 0)`),

		Acquire: t.render(`WITH free AS (
	SELECT lane, rewind FROM {outbox_lanes} WHERE owner IS NULL OR expires_at <= now()
	ORDER BY lane LIMIT $3 FOR UPDATE SKIP LOCKED
)
UPDATE {outbox_lanes} l SET owner = $1, token = gen_random_uuid(), expires_at = now() + $2::int8 @us, rewind = NULL
FROM free WHERE l.lane = free.lane
RETURNING l.lane, l.token, l.floor, coalesce(free.rewind, 0)`),

		Release: t.render(`UPDATE {outbox_lanes} l SET owner = NULL, token = NULL, expires_at = NULL, floor = greatest(h.floor, 0)
FROM unnest($2::int4[], $3::uuid[], $4::int8[]) AS h(lane, token, floor)
WHERE l.lane = h.lane AND l.token = h.token AND l.owner = $1`),

		Leave: t.render(`DELETE FROM {outbox_relays} WHERE owner = $1`),

		Get: t.render(`SELECT ` + outboxColumns + ` FROM {outbox} WHERE id = $1`),

		SetStatus: t.render(`UPDATE {outbox} SET status = $2, attempts = CASE WHEN $2::text IS NULL THEN 0 ELSE attempts END
WHERE id = $1 AND published_at IS NULL AND status = ANY($3::text[]) RETURNING pos, hash`),

		Rewind: t.render(`UPDATE {outbox_lanes} SET rewind = least(coalesce(rewind, $1), $1)
WHERE lane = $2 % (SELECT count(*) FROM {outbox_lanes})`),

		Lanes: t.render(`SELECT l.lane, coalesce(l.owner, ''), l.expires_at, l.floor,
	(SELECT min(o.created_at) FROM {outbox} o WHERE o.pos > l.floor AND ` + unsettled + `
		AND o.hash % (SELECT count(*) FROM {outbox_lanes}) = l.lane)
FROM {outbox_lanes} l ORDER BY l.lane`),

		Counts: t.render(`SELECT CASE WHEN published_at IS NOT NULL THEN 'published' ELSE coalesce(status, 'pending') END, count(*)
FROM {outbox} GROUP BY 1`),

		listAttention: list(`status IS NOT NULL`),
		listStatus:    list(`status = $5`),
		listPending:   list(`pos > (SELECT coalesce(min(floor), 0) FROM {outbox_lanes}) AND published_at IS NULL AND status IS NULL`),
		listPublished: list(`published_at IS NOT NULL`),
		listAll:       list(`true`),
	}
}

// outboxPayloadsFamily is idem_outbox_payloads: message bodies over PayloadInlineMax, by the UTC
// day their message was appended on (its created_at's). Its partition of a day goes once no
// message of that day is left in idem_outbox: every message that can still be fetched, listed,
// retried or published has its row there, with payload_day naming the day, and so keeps the
// partition (the probe is one lookup in the partial index idem_outbox_payload_day). Published
// and skipped messages leave with the reaper after the retention; a stopped or dead-lettered one
// keeps its day's partition until an operator acts. A message of day D that commits late (its
// transaction open for more than a day) cannot lose its body: the partition is dropped only
// after the detach, which waits for every writer of the partition, and a second look at this rule
// (see dropPartitions).
var outboxPayloadsFamily = payloadFamily{
	base:      "idem_outbox_payloads",
	table:     func(t Tables) string { return t.OutboxPayloads },
	ahead:     2, // the day is always today's: two more are plenty for a reaper that stops for a while
	droppable: `SELECT NOT EXISTS (SELECT FROM {outbox} WHERE payload_day = $1::date)`,
}

// largeBody is the head of the statements that append messages with a large body, after x: the
// day of the partition the bodies go to, that of the statement's UTC day (and so of the
// messages' created_at), once idem_outbox_payloads_put has stored the bodies (the uuid[] ids,
// the bytea[] data) there, or NULL when that partition does not exist and the bodies stay in
// their rows. The function inserts into the partition by name: an INSERT through the partitioned
// table would route rows with the partitions it knew when it started, and fail if today's was
// attached meanwhile.
func largeBody(t Tables, ids, data string) string {
	return largeBodyBy(t, "idem_outbox_payloads_put", ids, data)
}

// largeBodyOne is largeBody for one message: idem_outbox_payload_put takes its id and body as
// they are, without arrays to build and take apart.
func largeBodyOne(t Tables, id, data string) string {
	return largeBodyBy(t, "idem_outbox_payload_put", id, data)
}

func largeBodyBy(t Tables, fn, ids, data string) string {
	today := utcDay("statement_timestamp()")
	return `, p AS (
	SELECT CASE WHEN ` + t.qualify(fn) + `(` + t.partitionNameSQL("idem_outbox_payloads", today) + `, ` + today + `, ` + ids + `, ` + data + `)
		THEN ` + today + ` END AS day
)`
}

// OutboxMessage is a message as Append writes it.
type OutboxMessage struct {
	ID      [16]byte
	Topic   string
	Key     string // "" for none
	Hash    int32  // 31 bits, from the key (or the id, without a key)
	Payload []byte
	Headers map[string]string
}

// OutboxAppend returns the statement that writes msgs (one or more), for the caller to run now
// or queue for COMMIT. It has no result. A body over PayloadInlineMax bytes goes to today's
// partition of idem_outbox_payloads when there is one; the statement that does so is sent only
// when a message's body is that large.
func (st *Statements) OutboxAppend(msgs []OutboxMessage) (Stmt, error) {
	big := false
	for _, m := range msgs {
		big = big || large(len(m.Payload))
	}
	if len(msgs) == 1 {
		m := msgs[0]
		h, err := headersJSON(m.Headers)
		if err != nil {
			return Stmt{}, err
		}
		id := pgtype.UUID{Bytes: m.ID, Valid: true}
		switch {
		case m.Key == "" && big:
			return Stmt{SQL: st.outbox.appendUnkeyedLarge, Args: []any{id, m.Topic, m.Hash, m.Payload, h}}, nil
		case m.Key == "":
			return Stmt{SQL: st.outbox.AppendUnkeyed, Args: []any{id, m.Topic, m.Hash, m.Payload, h}}, nil
		case big:
			return Stmt{SQL: st.outbox.appendLarge, Args: []any{id, m.Topic, m.Key, m.Hash, m.Payload, h}}, nil
		}
		return Stmt{SQL: st.outbox.Append, Args: []any{id, m.Topic, m.Key, m.Hash, m.Payload, h}}, nil
	}
	var (
		ids       = make([]pgtype.UUID, len(msgs))
		topics    = make([]string, len(msgs))
		keys      = make([]string, len(msgs))
		hashes    = make([]int32, len(msgs))
		followers = make([]int64, len(msgs))
		payloads  = make([][]byte, len(msgs))
		headers   = make([]*string, len(msgs))
		counts    = map[string]int64{}
		distinct  []string
	)
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		h, err := headersJSON(m.Headers)
		if err != nil {
			return Stmt{}, err
		}
		ids[i], topics[i], keys[i], hashes[i], payloads[i], headers[i] = pgtype.UUID{Bytes: m.ID, Valid: true}, m.Topic, m.Key, m.Hash, m.Payload, h
		if m.Key != "" {
			if _, seen := counts[m.Key]; !seen {
				distinct = append(distinct, m.Key)
			}
			followers[i] = counts[m.Key]
			counts[m.Key]++
		}
	}
	n := make([]int64, len(distinct))
	for i, k := range distinct {
		n[i] = counts[k]
	}
	sql := st.outbox.AppendBatch
	if big {
		sql = st.outbox.appendBatchLarge
	}
	return Stmt{SQL: sql, Args: []any{ids, topics, keys, hashes, followers, payloads, headers, distinct, n}}, nil
}

func headersJSON(h map[string]string) (*string, error) {
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	s := string(b)
	return &s, nil
}

// OutboxRow is a message as the relay and operators read it.
type OutboxRow struct {
	Pos         int64
	ID          [16]byte
	Topic       string
	Key         string
	Seq         int64 // 0 without a key
	Hash        int32
	Payload     []byte     // read from idem_outbox_payloads when PayloadDay is set; nil if it is gone there
	PayloadDay  *time.Time // the day of the partition of idem_outbox_payloads that holds a large body
	Headers     map[string]string
	CreatedUS   int64 // µs since the epoch, by the database's clock
	PublishedAt *time.Time
	Attempts    int
	LastError   string
	Status      string // "", "stopped", "dead" or "skipped"
}

func (r *OutboxRow) dest() []any {
	return []any{&r.Pos, (*uuidDest)(&r.ID), &r.Topic, &r.Key, &r.Seq, &r.Hash, &r.Payload, &r.PayloadDay, &r.Headers,
		&r.CreatedUS, &r.PublishedAt, &r.Attempts, &r.LastError, &r.Status}
}

// uuidDest scans a uuid (or NULL, as the zero id) into a [16]byte.
type uuidDest [16]byte

func (u *uuidDest) ScanUUID(v pgtype.UUID) error {
	*u = v.Bytes
	return nil
}

// outboxBodies reads the large bodies of rows (those with a PayloadDay) from their days'
// partitions of idem_outbox_payloads: one statement per day, each on that one partition by name,
// never on the partitioned table (a generic plan over it would plan and lock every partition).
// It returns the rows whose body is not there: their partition was dropped, or never held them,
// which for a message still in idem_outbox the family's rule makes impossible, unless the message
// was reaped after rows were read.
func (st *Statements) outboxBodies(ctx context.Context, q Querier, rows ...[]OutboxRow) ([]*OutboxRow, error) {
	type want struct {
		ids  []pgtype.UUID
		rows map[[16]byte]*OutboxRow
	}
	var (
		days  []time.Time
		byDay map[time.Time]*want
	)
	for _, rs := range rows {
		for i := range rs {
			r := &rs[i]
			if r.PayloadDay == nil {
				continue
			}
			if byDay == nil {
				byDay = map[time.Time]*want{}
			}
			w := byDay[*r.PayloadDay]
			if w == nil {
				w = &want{rows: map[[16]byte]*OutboxRow{}}
				byDay[*r.PayloadDay] = w
				days = append(days, *r.PayloadDay)
			}
			w.ids = append(w.ids, pgtype.UUID{Bytes: r.ID, Valid: true})
			w.rows[r.ID] = r
		}
	}
	var missing []*OutboxRow
	for _, day := range days {
		w := byDay[day]
		sql := `SELECT id, data FROM ` + st.Tables.qualify(PartitionName("idem_outbox_payloads", day)) + ` WHERE day = $1 AND id = ANY($2)`
		res, err := q.Query(ctx, sql, day, w.ids)
		if err != nil && !IsMissingTable(err) {
			return nil, err
		}
		if err == nil {
			var (
				id   uuidDest
				data []byte
			)
			_, err = pgx.ForEachRow(res, []any{&id, &data}, func() error {
				if r := w.rows[id]; r != nil {
					r.Payload = data
					delete(w.rows, id)
				}
				return nil
			})
			if err != nil && !IsMissingTable(err) {
				return nil, err
			}
		}
		for _, r := range w.rows {
			missing = append(missing, r)
		}
	}
	return missing, nil
}

// outboxBodiesLive is outboxBodies for the relay's reads, whose messages are unsettled: a body
// that is not there is an error, never an empty message to publish.
func (st *Statements) outboxBodiesLive(ctx context.Context, q Querier, rows ...[]OutboxRow) error {
	missing, err := st.outboxBodies(ctx, q, rows...)
	if err != nil {
		return fmt.Errorf("reading large message bodies: %w", err)
	}
	if len(missing) > 0 {
		r := missing[0]
		return fmt.Errorf("the body of outbox message %s (position %d) is missing from %s: was that partition dropped by hand?",
			uuid.UUID(r.ID), r.Pos, st.Tables.qualify(PartitionName("idem_outbox_payloads", *r.PayloadDay)))
	}
	return nil
}
