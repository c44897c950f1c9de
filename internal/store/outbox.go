package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// OutboxStatements are package outbox's statements: appending messages, the relay's reads and
// writes, its lanes, and the operator's reads and fixes. Arguments are listed as $n = name.
type OutboxStatements struct {
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
	// $3 tokens, $4 floors, $5 lease µs. Returns each lane renewed and its rewind.
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
const outboxColumns = `pos, id, topic, key, coalesce(seq, 0), hash, payload, headers,
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

func outboxStatements(t Tables) OutboxStatements {
	const xid = `WITH x AS MATERIALIZED (SELECT pg_current_xact_id() AS xid)`
	list := func(where string) string {
		return t.render(`SELECT ` + outboxColumns + ` FROM {outbox} WHERE pos > $1 AND ` + where +
			` AND ($2 = '' OR topic = $2) AND ($3 = '' OR key = $3) ORDER BY pos LIMIT $4`)
	}
	return OutboxStatements{
		Append: t.render(xid + `, k AS (
	INSERT INTO {outbox_keys} AS k (key, seq) SELECT $3, 1 FROM x
	ON CONFLICT (key) DO UPDATE SET seq = k.seq + 1
	RETURNING seq
)
INSERT INTO {outbox} (id, xid, topic, key, seq, hash, payload, headers)
SELECT $1, x.xid, $2, $3, k.seq, $4, $5, $6::jsonb FROM k, x`),

		AppendUnkeyed: t.render(xid + `
INSERT INTO {outbox} (id, xid, topic, key, hash, payload, headers)
SELECT $1, x.xid, $2, '', $3, $4, $5::jsonb FROM x`),

		AppendBatch: t.render(xid + `, k AS (
	INSERT INTO {outbox_keys} AS k (key, seq)
	SELECT u.key, u.n FROM x, unnest($8::text[], $9::int8[]) AS u(key, n) ORDER BY u.key
	ON CONFLICT (key) DO UPDATE SET seq = k.seq + excluded.seq
	RETURNING key, seq
)
INSERT INTO {outbox} (id, xid, topic, key, seq, hash, payload, headers)
SELECT u.id, x.xid, u.topic, u.key, k.seq - u.followers, u.hash, u.payload, u.headers::jsonb
FROM x CROSS JOIN unnest($1::uuid[], $2::text[], $3::text[], $4::int4[], $5::int8[], $6::bytea[], $7::text[])
	WITH ORDINALITY AS u(id, topic, key, hash, followers, payload, headers, n)
LEFT JOIN k ON k.key = u.key
ORDER BY u.n`),

		Start: t.render(`WITH s AS MATERIALIZED (` + snapshotNow + `)
SELECT coalesce((SELECT max(pos) FROM {outbox}), 0), s.snap, s.next FROM s`),

		Fetch: t.render(`WITH s AS MATERIALIZED (` + snapshotNow + `)
SELECT 0, s.snap, s.now, (SELECT coalesce(max(pos), 0) FROM {outbox}), NULL::uuid, '', '', s.next, 0, NULL::bytea, NULL::jsonb, 0::int8, NULL::timestamptz, 0, '', '' FROM s
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
RETURNING l.lane, mine.rewind`),

		Acquire: t.render(`WITH free AS (
	SELECT lane, rewind FROM {outbox_lanes} WHERE owner IS NULL OR expires_at <= now()
	ORDER BY lane LIMIT $3 FOR UPDATE SKIP LOCKED
)
UPDATE {outbox_lanes} l SET owner = $1, token = gen_random_uuid(), expires_at = now() + $2::int8 @us, rewind = NULL
FROM free WHERE l.lane = free.lane
RETURNING l.lane, l.token, l.floor, free.rewind`),

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

// OutboxMessage is a message as Append writes it.
type OutboxMessage struct {
	ID      [16]byte
	Topic   string
	Key     string // "" for none
	Hash    int32  // 31 bits, from the key (or the id, without a key)
	Payload []byte
	Headers map[string]string
}

// OutboxAppend returns the statement and arguments that write msgs (one or more), for the caller
// to run now or queue for COMMIT.
func OutboxAppend(st *Statements, msgs []OutboxMessage) (string, []any, error) {
	if len(msgs) == 1 {
		m := msgs[0]
		h, err := headersJSON(m.Headers)
		if err != nil {
			return "", nil, err
		}
		id := pgtype.UUID{Bytes: m.ID, Valid: true}
		if m.Key == "" {
			return st.Outbox.AppendUnkeyed, []any{id, m.Topic, m.Hash, m.Payload, h}, nil
		}
		return st.Outbox.Append, []any{id, m.Topic, m.Key, m.Hash, m.Payload, h}, nil
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
			return "", nil, err
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
	return st.Outbox.AppendBatch, []any{ids, topics, keys, hashes, followers, payloads, headers, distinct, n}, nil
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
	Payload     []byte
	Headers     map[string]string
	CreatedUS   int64 // µs since the epoch, by the database's clock
	PublishedAt *time.Time
	Attempts    int
	LastError   string
	Status      string // "", "stopped", "dead" or "skipped"
}

func (r *OutboxRow) dest() []any {
	return []any{&r.Pos, (*uuidDest)(&r.ID), &r.Topic, &r.Key, &r.Seq, &r.Hash, &r.Payload, &r.Headers,
		&r.CreatedUS, &r.PublishedAt, &r.Attempts, &r.LastError, &r.Status}
}

// uuidDest scans a uuid (or NULL, as the zero id) into a [16]byte.
type uuidDest [16]byte

func (u *uuidDest) ScanUUID(v pgtype.UUID) error {
	*u = v.Bytes
	return nil
}

// Snapshot is a Postgres snapshot (pg_snapshot): transactions below Xmin are over, those in
// Xip were in progress, those at or above Xmax were in progress or had not begun (Postgres lists
// only xids below Xmax, one past the latest completed). Next, when read, is the next xid to be
// assigned, read after the snapshot: every xid assigned before the snapshot is below it.
type Snapshot struct {
	Xmin, Xmax uint64
	Xip        []uint64
	Next       uint64
}

// ParseSnapshot reads pg_snapshot's text form, "xmin:xmax:xip,xip,...".
func ParseSnapshot(s string) (Snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("store: snapshot %q is not xmin:xmax:xip", s)
	}
	var snap Snapshot
	var err error
	if snap.Xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("store: snapshot %q: %w", s, err)
	}
	if snap.Xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("store: snapshot %q: %w", s, err)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return Snapshot{}, fmt.Errorf("store: snapshot %q: %w", s, err)
			}
			snap.Xip = append(snap.Xip, v)
		}
	}
	return snap, nil
}

// InProgress reports whether xid was in progress in the snapshot, or had not begun.
func (s Snapshot) InProgress(xid uint64) bool {
	if xid >= s.Xmax {
		return true
	}
	for _, x := range s.Xip {
		if x == xid {
			return true
		}
	}
	return false
}

// OutboxStart reads the highest position and the snapshot of that read.
func OutboxStart(ctx context.Context, q Querier, st *Statements) (int64, Snapshot, error) {
	var (
		pos  int64
		snap string
		next int64
	)
	if err := q.QueryRow(ctx, st.Outbox.Start).Scan(&pos, &snap, &next); err != nil {
		return 0, Snapshot{}, err
	}
	s, err := ParseSnapshot(snap)
	s.Next = uint64(next)
	return pos, s, err
}

// OutboxFetchParams are the arguments of Fetch.
type OutboxFetchParams struct {
	Cursor int64
	Late   []uint64 // xids in progress at earlier reads
	Limit  int
	Lanes  int     // number of lanes
	Live   []int32 // lanes read past the cursor
	Owned  []int32 // lanes whose late messages are read (live and catching up)
	From   uint64  // every xid from here on may be in progress unlisted (the last Xmax)
}

// OutboxFetched is what Fetch read.
type OutboxFetched struct {
	Snapshot Snapshot
	NowUS    int64 // the database's clock
	MaxPos   int64 // the highest position visible to the snapshot
	New      []OutboxRow
	Late     []OutboxRow
}

// OutboxFetch runs Fetch.
func OutboxFetch(ctx context.Context, q Querier, st *Statements, p OutboxFetchParams) (OutboxFetched, error) {
	late := make([]int64, len(p.Late))
	for i, x := range p.Late {
		late[i] = int64(x)
	}
	rows, err := q.Query(ctx, st.Outbox.Fetch, p.Cursor, late, p.Limit, p.Lanes, p.Live, p.Owned, int64(p.From))
	if err != nil {
		return OutboxFetched{}, err
	}
	defer rows.Close()
	var (
		out  OutboxFetched
		src  int
		snap string
		now  int64
	)
	for rows.Next() {
		var r OutboxRow
		if err := rows.Scan(append([]any{&src, &snap, &now}, r.dest()...)...); err != nil {
			return OutboxFetched{}, err
		}
		switch src {
		case 0:
			out.NowUS, out.MaxPos = now, r.Pos
			if out.Snapshot, err = ParseSnapshot(snap); err != nil {
				return OutboxFetched{}, err
			}
			out.Snapshot.Next = uint64(r.Seq)
		case 1:
			out.New = append(out.New, r)
		default:
			out.Late = append(out.Late, r)
		}
	}
	return out, rows.Err()
}

// OutboxCatchUp runs CatchUp: the unsettled messages of lanes with positions in (from, to], and
// the database's clock.
func OutboxCatchUp(ctx context.Context, q Querier, st *Statements, from, to int64, limit, lanes int, which []int32) ([]OutboxRow, int64, error) {
	rows, err := q.Query(ctx, st.Outbox.CatchUp, from, to, limit, lanes, which)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var (
		out []OutboxRow
		now int64
	)
	for rows.Next() {
		var r OutboxRow
		if err := rows.Scan(append(r.dest(), &now)...); err != nil {
			return nil, 0, err
		}
		out = append(out, r)
	}
	return out, now, rows.Err()
}

// LaneToken is a lane a relay holds and the token of its lease.
type LaneToken struct {
	Lane  int32
	Token [16]byte
	Floor int64 // for Renew and Release
}

// OutboxWrite is what the relay records of one message.
type OutboxWrite struct {
	ID        [16]byte
	Lane      int32
	Published bool
	Attempts  int
	Error     string
	Status    string // "", "stopped" or "dead"
}

// OutboxWriteAll runs Write: it records writes for the lanes of held that the relay still holds,
// and returns those lanes and how many messages it wrote.
func OutboxWriteAll(ctx context.Context, q Querier, st *Statements, held []LaneToken, writes []OutboxWrite) ([]int32, int64, error) {
	lanes, tokens, _ := laneArrays(held)
	var (
		ids       = make([]pgtype.UUID, len(writes))
		wl        = make([]int32, len(writes))
		published = make([]bool, len(writes))
		attempts  = make([]int32, len(writes))
		errs      = make([]string, len(writes))
		statuses  = make([]string, len(writes))
	)
	for i, w := range writes {
		ids[i], wl[i], published[i], attempts[i], errs[i], statuses[i] = pgtype.UUID{Bytes: w.ID, Valid: true}, w.Lane, w.Published, int32(w.Attempts), w.Error, w.Status
	}
	var (
		still []int32
		n     int64
	)
	err := q.QueryRow(ctx, st.Outbox.Write, lanes, tokens, ids, wl, published, attempts, errs, statuses).Scan(&still, &n)
	return still, n, err
}

func laneArrays(ls []LaneToken) ([]int32, []pgtype.UUID, []int64) {
	lanes := make([]int32, len(ls))
	tokens := make([]pgtype.UUID, len(ls))
	floors := make([]int64, len(ls))
	for i, l := range ls {
		lanes[i], tokens[i], floors[i] = l.Lane, pgtype.UUID{Bytes: l.Token, Valid: true}, l.Floor
	}
	return lanes, tokens, floors
}

// OutboxLanesInit creates n lanes if there are none, and returns how many lanes there are. q must
// not be a transaction: the count is read after the insert committed.
func OutboxLanesInit(ctx context.Context, q Querier, st *Statements, n int) (int, error) {
	if _, err := q.Exec(ctx, st.Outbox.LanesInit, n); err != nil {
		return 0, err
	}
	var count int
	err := q.QueryRow(ctx, st.Outbox.LanesCount).Scan(&count)
	return count, err
}

// OutboxHeartbeat renews owner's row for lease µs and returns the live relays' names, sorted.
func OutboxHeartbeat(ctx context.Context, q Querier, st *Statements, owner string, leaseUS int64) ([]string, error) {
	var live []string
	err := q.QueryRow(ctx, st.Outbox.Heartbeat, owner, leaseUS).Scan(&live)
	return live, err
}

// LaneRewind is a lane renewed or acquired, and the position an operator asked its owner to
// read it again from (0 for none).
type LaneRewind struct {
	LaneToken
	Rewind int64
}

// OutboxRenew renews the leases of held (recording their floors) and returns the lanes renewed.
func OutboxRenew(ctx context.Context, q Querier, st *Statements, owner string, held []LaneToken, leaseUS int64) ([]LaneRewind, error) {
	lanes, tokens, floors := laneArrays(held)
	rows, err := q.Query(ctx, st.Outbox.Renew, owner, lanes, tokens, floors, leaseUS)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LaneRewind, error) {
		var (
			l      LaneRewind
			rewind *int64
		)
		err := row.Scan(&l.Lane, &rewind)
		if rewind != nil {
			l.Rewind = *rewind
		}
		return l, err
	})
}

// OutboxAcquire takes up to n free lanes (no owner, or a lease that ran out).
func OutboxAcquire(ctx context.Context, q Querier, st *Statements, owner string, leaseUS int64, n int) ([]LaneRewind, error) {
	rows, err := q.Query(ctx, st.Outbox.Acquire, owner, leaseUS, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LaneRewind, error) {
		var (
			l      LaneRewind
			rewind *int64
		)
		err := row.Scan(&l.Lane, (*uuidDest)(&l.Token), &l.Floor, &rewind)
		if rewind != nil {
			l.Rewind = *rewind
		}
		return l, err
	})
}

// OutboxRelease gives up lanes, recording their floors.
func OutboxRelease(ctx context.Context, q Querier, st *Statements, owner string, lanes []LaneToken) error {
	l, tokens, floors := laneArrays(lanes)
	_, err := q.Exec(ctx, st.Outbox.Release, owner, l, tokens, floors)
	return err
}

// OutboxLeave deletes owner's row of live relays.
func OutboxLeave(ctx context.Context, q Querier, st *Statements, owner string) error {
	_, err := q.Exec(ctx, st.Outbox.Leave, owner)
	return err
}

// OutboxGet reads a message by id; pgx.ErrNoRows when there is none.
func OutboxGet(ctx context.Context, q Querier, st *Statements, id [16]byte) (OutboxRow, error) {
	var r OutboxRow
	err := q.QueryRow(ctx, st.Outbox.Get, pgtype.UUID{Bytes: id, Valid: true}).Scan(r.dest()...)
	return r, err
}

// OutboxListParams filter a list of messages.
type OutboxListParams struct {
	// Status is "attention" (stopped, dead or skipped), "pending" (not yet published, not set
	// aside), "published", "stopped", "dead", "skipped", or "all".
	Status string
	Topic  string // "" for any
	Key    string // "" for any
	After  int64  // position to list after
	Limit  int
}

// OutboxList lists messages in position order.
func OutboxList(ctx context.Context, q Querier, st *Statements, p OutboxListParams) ([]OutboxRow, error) {
	args := []any{p.After, p.Topic, p.Key, p.Limit}
	var sql string
	switch p.Status {
	case "attention":
		sql = st.Outbox.listAttention
	case "pending":
		sql = st.Outbox.listPending
	case "published":
		sql = st.Outbox.listPublished
	case "all":
		sql = st.Outbox.listAll
	case "stopped", "dead", "skipped":
		sql, args = st.Outbox.listStatus, append(args, p.Status)
	default:
		return nil, fmt.Errorf("store: unknown outbox status filter %q", p.Status)
	}
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxRow, error) {
		var r OutboxRow
		return r, row.Scan(r.dest()...)
	})
}

// OutboxSetStatus sets a message's status ("" for the relay to take it up again, with its attempts
// reset) if its status is one of from, and asks its lane's owner to read the lane again from it.
// It reports whether the message was changed; q should be a transaction.
func OutboxSetStatus(ctx context.Context, q Querier, st *Statements, id [16]byte, status string, from []string) (bool, error) {
	var (
		pos  int64
		hash int32
		s    *string
	)
	if status != "" {
		s = &status
	}
	err := q.QueryRow(ctx, st.Outbox.SetStatus, pgtype.UUID{Bytes: id, Valid: true}, s, from).Scan(&pos, &hash)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = q.Exec(ctx, st.Outbox.Rewind, pos, hash)
	return err == nil, err
}

// OutboxLane is a lane as operators see it.
type OutboxLane struct {
	Lane    int32
	Owner   string
	Expires *time.Time
	Floor   int64
	Oldest  *time.Time // the oldest unsettled message's creation
}

// OutboxLanes reads every lane.
func OutboxLanes(ctx context.Context, q Querier, st *Statements) ([]OutboxLane, error) {
	rows, err := q.Query(ctx, st.Outbox.Lanes)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxLane, error) {
		var l OutboxLane
		return l, row.Scan(&l.Lane, &l.Owner, &l.Expires, &l.Floor, &l.Oldest)
	})
}

// OutboxCounts counts the messages by status.
func OutboxCounts(ctx context.Context, q Querier, st *Statements) (map[string]int64, error) {
	rows, err := q.Query(ctx, st.Outbox.Counts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var (
			s string
			n int64
		)
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}
