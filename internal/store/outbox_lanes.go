package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

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
func (st *Statements) OutboxWriteAll(ctx context.Context, q Querier, held []LaneToken, writes []OutboxWrite) ([]int32, int64, error) {
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
	err := q.QueryRow(ctx, st.outbox.Write, lanes, tokens, ids, wl, published, attempts, errs, statuses).Scan(&still, &n)
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
func (st *Statements) OutboxLanesInit(ctx context.Context, q Querier, n int) (int, error) {
	if _, err := q.Exec(ctx, st.outbox.LanesInit, n); err != nil {
		return 0, err
	}
	var count int
	err := q.QueryRow(ctx, st.outbox.LanesCount).Scan(&count)
	return count, err
}

// OutboxHeartbeat renews owner's row for lease µs and returns the live relays' names, sorted.
func (st *Statements) OutboxHeartbeat(ctx context.Context, q Querier, owner string, leaseUS int64) ([]string, error) {
	var live []string
	err := q.QueryRow(ctx, st.outbox.Heartbeat, owner, leaseUS).Scan(&live)
	return live, err
}

// LaneRewind is a lane renewed or acquired, and the position an operator asked its owner to
// read it again from (0 for none).
type LaneRewind struct {
	LaneToken
	Rewind int64
}

// OutboxRenew renews the leases of held (recording their floors) and returns the lanes renewed.
func (st *Statements) OutboxRenew(ctx context.Context, q Querier, owner string, held []LaneToken, leaseUS int64) ([]LaneRewind, error) {
	lanes, tokens, floors := laneArrays(held)
	return collectLanes(q.Query(ctx, st.outbox.Renew, owner, lanes, tokens, floors, leaseUS))
}

// OutboxAcquire takes up to n free lanes (no owner, or a lease that ran out).
func (st *Statements) OutboxAcquire(ctx context.Context, q Querier, owner string, leaseUS int64, n int) ([]LaneRewind, error) {
	return collectLanes(q.Query(ctx, st.outbox.Acquire, owner, leaseUS, n))
}

// collectLanes reads what Renew and Acquire return: lane, token, floor, rewind.
func collectLanes(rows pgx.Rows, err error) ([]LaneRewind, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LaneRewind, error) {
		var l LaneRewind
		return l, row.Scan(&l.Lane, (*uuidDest)(&l.Token), &l.Floor, &l.Rewind)
	})
}

// OutboxRelease gives up lanes, recording their floors.
func (st *Statements) OutboxRelease(ctx context.Context, q Querier, owner string, lanes []LaneToken) error {
	l, tokens, floors := laneArrays(lanes)
	_, err := q.Exec(ctx, st.outbox.Release, owner, l, tokens, floors)
	return err
}

// OutboxLeave deletes owner's row of live relays.
func (st *Statements) OutboxLeave(ctx context.Context, q Querier, owner string) error {
	_, err := q.Exec(ctx, st.outbox.Leave, owner)
	return err
}
