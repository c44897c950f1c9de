package outbox

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/idemkit/idem/internal/store"
)

// lane is a lane the loop holds.
type lane struct {
	id    int32
	token [16]byte
	floor int64 // as the last owner recorded it

	// catching: the lane's messages up to catchPos have been read (and later ones are read by
	// catchUp, not past the cursor); a key whose head lies beyond catchPos waits.
	catching bool
	catchPos int64

	draining   bool      // being given up: nothing more is published from it
	dropped    int64     // the lowest position let go of while draining (0 for none)
	validUntil time.Time // the lease, by this process's clock, less a margin
	inflight   int
	lag        time.Duration
}

// tickResult is what one round of lane keeping found.
type tickResult struct {
	started   time.Time
	err       error
	target    int
	live      []string
	renewed   []store.LaneRewind
	acquired  []store.LaneRewind
	released  []int32
	start     bool // read a new cursor
	cursor    int64
	snapshot  store.Snapshot
	startFail error
}

// tick renews the loop's lanes, gives up the drained ones, and takes free ones up to its share,
// on a goroutine of its own.
func (l *loop) tick(ctx context.Context) {
	l.ticking = true
	var (
		held     []store.LaneToken
		release  []store.LaneToken
		draining = map[int32]bool{}
	)
	for _, ln := range l.owned {
		lt := store.LaneToken{Lane: ln.id, Token: ln.token, Floor: l.floor(ln)}
		held = append(held, lt)
		if ln.draining {
			draining[ln.id] = true
			if ln.inflight == 0 && !l.writesFor(ln.id) {
				release = append(release, lt)
			}
		}
	}
	cfg, st, db, lanes := l.r.cfg, l.r.st, l.r.db, l.lanes
	needStart := !l.cursorValid
	if l.stopping {
		l.ticking = false
		return
	}
	go func() {
		res := tickResult{started: time.Now()}
		ctx, cancel := context.WithTimeout(ctx, cfg.Lease)
		defer cancel()
		lease := cfg.Lease.Microseconds()
		live, err := st.OutboxHeartbeat(ctx, db, cfg.Name, lease)
		if err == nil && len(held) > 0 {
			res.renewed, err = st.OutboxRenew(ctx, db, cfg.Name, held, lease)
		}
		if err != nil {
			res.err = err
			l.post(func() { l.ticked(res) })
			return
		}
		res.target, res.live = share(live, cfg.Name, lanes), live
		keep := 0
		for _, rn := range res.renewed {
			if !draining[rn.Lane] {
				keep++
			}
		}
		if want := res.target - keep; want > 0 && len(draining) == 0 {
			if res.acquired, err = st.OutboxAcquire(ctx, db, cfg.Name, lease, want); err != nil {
				res.err = err
			}
		}
		if len(release) > 0 && res.err == nil {
			if err := st.OutboxRelease(ctx, db, cfg.Name, release); err != nil {
				res.err = err
			} else {
				for _, r := range release {
					res.released = append(res.released, r.Lane)
				}
			}
		}
		if len(res.acquired) > 0 && needStart {
			res.start = true
			res.cursor, res.snapshot, res.startFail = st.OutboxStart(ctx, db)
		}
		l.post(func() { l.ticked(res) })
	}()
}

// share is the number of lanes this relay should hold: the lanes split evenly between the live
// relays, the first ones by name taking one more when they do not divide.
func share(live []string, me string, lanes int) int {
	if !slices.Contains(live, me) {
		live = append(slices.Clone(live), me)
		sort.Strings(live)
	}
	rank := slices.Index(live, me)
	n := lanes / len(live)
	if rank < lanes%len(live) {
		n++
	}
	return n
}

// ticked applies a round of lane keeping.
func (l *loop) ticked(res tickResult) {
	l.ticking = false
	cfg := l.r.cfg
	if res.err != nil {
		l.tickFail++
		l.nextTick = time.Now().Add(min(dbBackoff.Wait(l.tickFail), l.tickEvery()))
		if l.tickFail == 1 || l.tickFail%20 == 0 {
			cfg.Logger.Warn("outbox: relay cannot renew its lanes; retrying", "relay", cfg.Name, "failures", l.tickFail, "error", res.err)
		}
		// What was renewed or taken before the error still counts; the rest is looked at again.
	} else {
		l.tickFail = 0
		l.nextTick = res.started.Add(l.tickEvery())
	}
	valid := res.started.Add(cfg.Lease * 3 / 4)
	renewed := map[int32]int64{}
	for _, rn := range res.renewed {
		renewed[rn.Lane] = rn.Rewind
	}
	for _, id := range res.released {
		if ln := l.owned[id]; ln != nil {
			l.dropLane(ln)
			cfg.Logger.Debug("outbox: relay gave a lane up", "relay", cfg.Name, "lane", id)
		}
	}
	if res.err == nil || len(res.renewed) > 0 {
		for _, ln := range l.owned {
			rewind, ok := renewed[ln.id]
			switch {
			case ok:
				ln.validUntil = valid
				if rewind > 0 {
					l.reread(ln, rewind-1)
				}
				l.readyLane(ln.id)
			case res.err == nil:
				l.lose(ln, "its lease was not renewed")
			}
		}
	}
	if res.start {
		if res.startFail != nil {
			// Without a cursor the lanes cannot be read; give them back at once.
			cfg.Logger.Warn("outbox: relay cannot read where to start; retrying", "relay", cfg.Name, "error", res.startFail)
			release := make([]store.LaneToken, 0, len(res.acquired))
			for _, a := range res.acquired {
				release = append(release, a.LaneToken)
			}
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = l.r.st.OutboxRelease(ctx, l.r.db, cfg.Name, release)
			}()
			res.acquired = nil
		} else {
			l.cursor, l.cursorValid = res.cursor, true
			clear(l.remembered)
			// Transactions in progress at the start may hold any position the lanes' floors
			// allow.
			bound := res.cursor
			for _, a := range res.acquired {
				bound = min(bound, a.Floor)
			}
			l.unlistedPos, l.marks = bound, nil
			l.track(res.snapshot)
		}
	}
	for _, a := range res.acquired {
		from := a.Floor
		if a.Rewind > 0 {
			from = min(from, a.Rewind-1)
		}
		l.owned[a.Lane] = &lane{id: a.Lane, token: a.Token, floor: a.Floor, catching: true, catchPos: from, validUntil: valid}
		cfg.Logger.Debug("outbox: relay took a lane", "relay", cfg.Name, "lane", a.Lane, "from", from)
	}
	if res.err == nil {
		if res.target != l.target {
			cfg.Logger.Debug("outbox: relay's share of the lanes", "relay", cfg.Name, "lanes", res.target, "relays", res.live)
			l.target = res.target
		}
		l.rebalance(res.target)
	}
	if len(l.owned) == 0 {
		l.cursorValid = false
		clear(l.remembered)
	}
	l.measureLag()
}

// rebalance starts giving up lanes beyond target, highest first.
func (l *loop) rebalance(target int) {
	var keep []int32
	for id, ln := range l.owned {
		if !ln.draining {
			keep = append(keep, id)
		}
	}
	if len(keep) <= target {
		return
	}
	slices.Sort(keep)
	for _, id := range keep[target:] {
		l.drain(l.owned[id])
	}
}

// drain stops publishing from ln and lets go of what it holds but has not sent; the lane is
// given up once its batches in flight are back and recorded.
func (l *loop) drain(ln *lane) {
	ln.draining = true
	// Nothing past the cursor (or past where a catch-up got) was read: the next owner starts
	// there at the latest, and earlier where this loop lets go of something.
	if ln.catching {
		ln.drop(ln.catchPos + 1)
	} else {
		ln.drop(l.cursor + 1)
	}
	for id, ks := range l.keys {
		if ks.lane != ln.id {
			continue
		}
		if len(ks.queue) > 0 {
			ln.drop(ks.queue[0].row.Pos)
		}
		if ks.gapFrom > 0 {
			ln.drop(ks.gapFrom)
		}
		l.pending -= len(ks.queue)
		ks.queue = nil
		if ks.inflight == nil {
			delete(l.keys, id)
		}
	}
}

// drop notes that the message at pos was let go of.
func (ln *lane) drop(pos int64) {
	if ln.dropped == 0 || pos < ln.dropped {
		ln.dropped = pos
	}
}

// lose forgets ln, which another relay may own now.
func (l *loop) lose(ln *lane, why string) {
	l.r.cfg.Logger.Warn("outbox: relay lost a lane; another relay takes it over", "relay", l.r.cfg.Name, "lane", ln.id, "why", why)
	l.dropLane(ln)
}

// dropLane forgets ln and everything of it that is not in flight.
func (l *loop) dropLane(ln *lane) {
	for id, ks := range l.keys {
		if ks.lane == ln.id {
			l.pending -= len(ks.queue)
			ks.queue = nil
			delete(l.keys, id)
		}
	}
	for id, w := range l.toWrite {
		if w.Lane == ln.id {
			delete(l.toWrite, id)
			delete(l.acked, id)
		}
	}
	delete(l.owned, ln.id)
	if len(l.owned) == 0 {
		l.cursorValid = false
		clear(l.remembered)
	}
}

// writesFor reports whether writes of lane id are pending.
func (l *loop) writesFor(id int32) bool {
	for _, w := range l.toWrite {
		if w.Lane == id {
			return true
		}
	}
	for _, w := range l.writingNow {
		if w.Lane == id {
			return true
		}
	}
	return false
}

// reread reads ln again from just after pos: an operator changed a message there, or a key
// dropped messages it could not hold. Stopped heads are dropped to be read again as they are now.
func (l *loop) reread(ln *lane, pos int64) {
	for id, ks := range l.keys {
		if ks.lane != ln.id || !ks.stopped() {
			continue
		}
		pos = min(pos, ks.queue[0].row.Pos-1)
		l.pending -= len(ks.queue)
		ks.queue = nil
		if ks.inflight == nil {
			delete(l.keys, id)
		}
	}
	l.rewind(ln, pos)
}

// rewind makes ln catch up again from just after pos.
func (l *loop) rewind(ln *lane, pos int64) {
	if !ln.catching {
		ln.catching, ln.catchPos = true, pos
		return
	}
	ln.catchPos = min(ln.catchPos, pos)
}

// measureLag records, for each lane, the age of the oldest message the loop holds, for the lag
// metric.
func (l *loop) measureLag() {
	oldest := map[int32]time.Time{}
	note := func(lane int32, t time.Time) {
		if o, ok := oldest[lane]; !ok || t.Before(o) {
			oldest[lane] = t
		}
	}
	for _, ks := range l.keys {
		if ks.inflight != nil {
			note(ks.lane, ks.inflight.created)
		}
		if len(ks.queue) > 0 {
			note(ks.lane, ks.queue[0].created)
		}
	}
	now := time.Now()
	lags := make(map[int32]time.Duration, len(l.owned))
	for id, ln := range l.owned {
		ln.lag = 0
		if t, ok := oldest[id]; ok {
			ln.lag = max(now.Sub(t), 0)
		}
		lags[id] = ln.lag
	}
	l.r.tel.setLag(l, lags)
}
