package outbox

import (
	"context"
	"slices"
	"time"

	"github.com/idemkit/idem/internal/store"
)

// How the loop reads.
//
// Positions are taken in insert order, and one key's after the lock that orders its writers, so
// for one key position order is commit order. The loop reads the messages past its cursor in
// position order and moves the cursor to the last it read, or to the highest position its
// snapshot saw when it read them all. A position at or below the cursor that the snapshot did
// not see belongs to a transaction in progress then: the loop remembers the snapshot's
// in-progress xids, and each later read also asks for the messages of those xids (an index
// lookup), which finds them once they commit. So a transaction that stays open for a long time
// delays nothing but its own messages, and the loop never waits for the xmin horizon.
//
// Why the xids are enough: a writer takes its xid before its positions (see store's Append), so
// a transaction that had no xid yet at a read's snapshot takes positions past everything that
// snapshot saw, which is past the cursor.

// lanesOf lists the lanes the loop reads past the cursor (live) and those whose late messages it
// takes (live and catching up).
func (l *loop) lanesOf() (live, owned []int32) {
	for id, ln := range l.owned {
		if ln.draining {
			continue
		}
		owned = append(owned, id)
		if !ln.catching {
			live = append(live, id)
		}
	}
	slices.Sort(live)
	slices.Sort(owned)
	return live, owned
}

// fetch reads past the cursor, on a goroutine of its own.
func (l *loop) fetch(ctx context.Context) {
	live, owned := l.lanesOf()
	if len(owned) == 0 {
		return
	}
	p := store.OutboxFetchParams{Cursor: l.cursor, Limit: l.room(), Lanes: l.lanes, Live: live, Owned: owned, From: l.unlisted}
	for x := range l.remembered {
		p.Late = append(p.Late, x)
	}
	l.fetching = true
	epoch := l.beginRead()
	go func() {
		at := time.Now()
		f, err := l.r.st.OutboxFetch(ctx, l.r.db, p)
		l.post(func() { l.fetched(p, f, err, epoch, at) })
	}()
}

func (l *loop) beginRead() int64 {
	l.reads[l.readEpoch]++
	return l.readEpoch
}

func (l *loop) endRead(epoch int64) {
	if l.reads[epoch]--; l.reads[epoch] <= 0 {
		delete(l.reads, epoch)
	}
}

// fetched applies a read past the cursor.
func (l *loop) fetched(p store.OutboxFetchParams, f store.OutboxFetched, err error, epoch int64, at time.Time) {
	l.fetching = false
	l.endRead(epoch)
	now := time.Now()
	if err != nil {
		if !l.stopping {
			l.r.cfg.Logger.Warn("outbox: relay cannot read the outbox; retrying", "relay", l.r.cfg.Name, "error", err)
		}
		l.pollWait = min(max(l.pollWait*2, 50*time.Millisecond), 2*time.Second)
		l.nextPoll = now.Add(l.pollWait)
		return
	}
	if !l.cursorValid || l.cursor != p.Cursor {
		return // the loop started over meanwhile
	}
	l.add(f.New, f.NowUS, at, epoch)
	l.add(f.Late, f.NowUS, at, epoch)
	full := len(f.New) == p.Limit
	if full {
		l.cursor = f.New[len(f.New)-1].Pos
	} else {
		l.cursor = max(l.cursor, f.MaxPos)
	}
	l.track(f.Snapshot)
	switch {
	case full:
		l.pollWait, l.nextPoll = time.Millisecond, now
	case len(f.New) > 0 || len(f.Late) > 0:
		// More is likely on its way; a millisecond lets a few commits gather into the next read.
		l.pollWait, l.nextPoll = time.Millisecond, now.Add(time.Millisecond)
	default:
		l.pollWait = min(l.pollWait*2, l.r.cfg.PollInterval)
		l.nextPoll = now.Add(l.pollWait)
	}
}

// goLive has ln read past the cursor from now on, once it has caught up with it. Not while a
// read past the cursor is out: that read leaves ln out, yet moves the cursor.
func (l *loop) goLive(ln *lane) {
	if l.fetching {
		return
	}
	ln.catching = false
	l.readyLane(ln.id)
}

// track follows the transactions in progress after a read whose snapshot was snap (and which
// moved the cursor): those over are forgotten (their messages, if any, were in the read), those
// listed are remembered with a bound below their positions, and those from snap.Xmax on, which
// Postgres does not list, are covered as a range.
func (l *loop) track(snap store.Snapshot) {
	for x := range l.remembered {
		if !snap.InProgress(x) {
			delete(l.remembered, x)
		}
	}
	for _, x := range snap.Xip {
		if _, ok := l.remembered[x]; !ok {
			l.remembered[x] = l.boundOf(x)
		}
	}
	l.unlisted = snap.Xmax
	l.marks = append(l.marks, xidMark{next: snap.Next, cursor: l.cursor})
	l.unlistedPos = l.boundOf(snap.Xmax)
	// Keep the newest mark at or below the range's start, and the ones after it.
	keep := 0
	for i, m := range l.marks {
		if m.next <= l.unlisted {
			keep = i
		}
	}
	l.marks = l.marks[keep:]
}

// boundOf is a position below every message of the transaction xid, as far as the loop knows:
// the cursor of the newest read that began before xid was assigned.
func (l *loop) boundOf(xid uint64) int64 {
	bound := l.unlistedPos
	for _, m := range l.marks {
		if m.next <= xid {
			bound = max(bound, m.cursor)
		}
	}
	return bound
}

// catchUp reads the lanes that are catching up, from the lowest position they have reached to
// the cursor, on a goroutine of its own.
func (l *loop) catchUp(ctx context.Context) {
	var (
		which []int32
		from  int64
	)
	for id, ln := range l.owned {
		if !ln.catching || ln.draining {
			continue
		}
		if ln.catchPos >= l.cursor {
			l.goLive(ln)
			continue
		}
		if len(which) == 0 || ln.catchPos < from {
			from = ln.catchPos
		}
		which = append(which, id)
	}
	if len(which) == 0 {
		return
	}
	to, limit := l.cursor, l.room()
	l.catching = true
	epoch := l.beginRead()
	go func() {
		at := time.Now()
		rows, nowUS, err := l.r.st.OutboxCatchUp(ctx, l.r.db, from, to, limit, l.lanes, which)
		l.post(func() { l.caughtUp(which, from, to, limit, rows, nowUS, err, epoch, at) })
	}()
}

// caughtUp applies a catch-up read.
func (l *loop) caughtUp(which []int32, from, to int64, limit int, rows []store.OutboxRow, nowUS int64, err error, epoch int64, at time.Time) {
	l.catching = false
	l.endRead(epoch)
	if err != nil {
		if !l.stopping {
			l.r.cfg.Logger.Warn("outbox: relay cannot read the outbox; retrying", "relay", l.r.cfg.Name, "error", err)
		}
		l.catchRetryAt = time.Now().Add(dbBackoff.Wait(2))
		return
	}
	l.add(rows, nowUS, at, epoch)
	reached := to
	if len(rows) == limit {
		reached = rows[len(rows)-1].Pos
	}
	for _, id := range which {
		ln := l.owned[id]
		if ln == nil || !ln.catching || ln.catchPos < from {
			continue // given up, or rewound below this read meanwhile
		}
		ln.catchPos = max(ln.catchPos, reached)
		if ln.catchPos >= l.cursor {
			l.goLive(ln)
		}
		l.readyLane(id)
	}
}
