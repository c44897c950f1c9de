package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// OutboxGet reads a message by id, with its body; pgx.ErrNoRows when there is none. A large body
// that is gone from its partition (the message was reaped between the two reads) is nil.
func (st *Statements) OutboxGet(ctx context.Context, q Querier, id [16]byte) (OutboxRow, error) {
	var r OutboxRow
	err := q.QueryRow(ctx, st.outbox.Get, pgtype.UUID{Bytes: id, Valid: true}).Scan(r.dest()...)
	if err == nil && r.PayloadDay != nil {
		rows := []OutboxRow{r}
		_, err = st.outboxBodies(ctx, q, rows)
		r = rows[0]
	}
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

// OutboxList lists messages in position order, with their bodies (a large one read from its
// partition; nil if the message was reaped meanwhile).
func (st *Statements) OutboxList(ctx context.Context, q Querier, p OutboxListParams) ([]OutboxRow, error) {
	args := []any{p.After, p.Topic, p.Key, p.Limit}
	var sql string
	switch p.Status {
	case "attention":
		sql = st.outbox.listAttention
	case "pending":
		sql = st.outbox.listPending
	case "published":
		sql = st.outbox.listPublished
	case "all":
		sql = st.outbox.listAll
	case "stopped", "dead", "skipped":
		sql, args = st.outbox.listStatus, append(args, p.Status)
	default:
		return nil, fmt.Errorf("store: unknown outbox status filter %q", p.Status)
	}
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxRow, error) {
		var r OutboxRow
		return r, row.Scan(r.dest()...)
	})
	if err != nil {
		return nil, err
	}
	_, err = st.outboxBodies(ctx, q, out)
	return out, err
}

// OutboxSetStatus sets a message's status ("" for the relay to take it up again, with its attempts
// reset) if its status is one of from, and asks its lane's owner to read the lane again from it.
// It reports whether the message was changed; q should be a transaction.
func (st *Statements) OutboxSetStatus(ctx context.Context, q Querier, id [16]byte, status string, from []string) (bool, error) {
	var (
		pos  int64
		hash int32
		s    *string
	)
	if status != "" {
		s = &status
	}
	err := q.QueryRow(ctx, st.outbox.SetStatus, pgtype.UUID{Bytes: id, Valid: true}, s, from).Scan(&pos, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = q.Exec(ctx, st.outbox.Rewind, pos, hash)
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
func (st *Statements) OutboxLanes(ctx context.Context, q Querier) ([]OutboxLane, error) {
	rows, err := q.Query(ctx, st.outbox.Lanes)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxLane, error) {
		var l OutboxLane
		return l, row.Scan(&l.Lane, &l.Owner, &l.Expires, &l.Floor, &l.Oldest)
	})
}

// OutboxCounts counts the messages by status.
func (st *Statements) OutboxCounts(ctx context.Context, q Querier) (map[string]int64, error) {
	rows, err := q.Query(ctx, st.outbox.Counts)
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
