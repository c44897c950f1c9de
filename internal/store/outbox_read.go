package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

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
func (st *Statements) OutboxStart(ctx context.Context, q Querier) (int64, Snapshot, error) {
	var (
		pos  int64
		snap string
		next int64
	)
	if err := q.QueryRow(ctx, st.outbox.Start).Scan(&pos, &snap, &next); err != nil {
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

// OutboxFetch runs Fetch, and reads the large bodies of the messages it found (one more statement
// per day of them). A large body that is missing is an error: an unsettled message keeps its
// partition.
func (st *Statements) OutboxFetch(ctx context.Context, q Querier, p OutboxFetchParams) (OutboxFetched, error) {
	late := make([]int64, len(p.Late))
	for i, x := range p.Late {
		late[i] = int64(x)
	}
	rows, err := q.Query(ctx, st.outbox.Fetch, p.Cursor, late, p.Limit, p.Lanes, p.Live, p.Owned, int64(p.From))
	if err != nil {
		return OutboxFetched{}, err
	}
	defer rows.Close()
	large := false
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
		large = large || r.PayloadDay != nil
	}
	rows.Close()
	if err := rows.Err(); err != nil || !large {
		return out, err
	}
	// The large bodies, after the rows are closed, so that q may be a connection or a transaction.
	return out, st.outboxBodiesLive(ctx, q, out.New, out.Late)
}

// OutboxCatchUp runs CatchUp: the unsettled messages of lanes with positions in (from, to], with
// their large bodies, and the database's clock.
func (st *Statements) OutboxCatchUp(ctx context.Context, q Querier, from, to int64, limit, lanes int, which []int32) ([]OutboxRow, int64, error) {
	rows, err := q.Query(ctx, st.outbox.CatchUp, from, to, limit, lanes, which)
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
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	return out, now, st.outboxBodiesLive(ctx, q, out)
}
