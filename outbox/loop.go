package outbox

import (
	"container/heap"
	"context"
	"math"
	"time"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/store"
)

// loop is one run of a relay. Its state belongs to the goroutine of run: the reads, publishes,
// writes and lane renewals run on goroutines of their own and hand their results back as
// functions on events, which run applies one at a time.
type loop struct {
	r      *Relay
	lanes  int // number of lanes in the outbox
	nudge  chan struct{}
	events chan func()
	done   chan struct{} // closed when the loop has stopped taking events

	owned map[int32]*lane
	keys  map[string]*keyState
	ready []*keyState // keys that can publish now, first come first served
	later retryHeap   // keys waiting out a backoff

	// Reading.
	cursorValid  bool             // cursor and remembered are current (false while holding no lane)
	cursor       int64            // every position up to here was read (or belongs to remembered)
	remembered   map[uint64]int64 // xids listed in progress at the last read -> a position below theirs
	unlisted     uint64           // xids from here on may be in progress without being listed
	unlistedPos  int64            // a position below those of the unlisted xids
	marks        []xidMark        // recent reads: xids from next on began after cursor was read
	fetching     bool
	catching     bool
	catchRetryAt time.Time
	nextPoll     time.Time
	pollWait     time.Duration
	readEpoch    int64 // counts writes completed, to tell a read that started before one
	reads        map[int64]int
	pending      int // messages held

	// Publishing.
	inFlight    int
	inFlightIDs map[[16]byte]bool
	acked       map[[16]byte]int64 // acknowledged: 0 while its write is pending, else the epoch it was written at
	pausedUntil time.Time          // the broker is unavailable
	unavailable int                // consecutive batches that found it so

	// Writing.
	toWrite      map[[16]byte]write
	writingNow   []write
	writing      bool
	writeRetryAt time.Time
	writeFails   int

	// Lanes.
	ticking  bool
	nextTick time.Time
	target   int // the share of lanes, as last found
	tickFail int

	stopping bool
}

// xidMark pairs a read's next xid with the cursor it reached: a transaction whose xid is at
// least next began after that read's snapshot, so its positions lie past cursor.
type xidMark struct {
	next   uint64
	cursor int64
}

// write is what will be recorded of a message, with where it sits.
type write struct {
	store.OutboxWrite
	pos int64
}

func newLoop(r *Relay, lanes int) *loop {
	return &loop{
		r: r, lanes: lanes, nudge: make(chan struct{}, 1), events: make(chan func(), 64), done: make(chan struct{}),
		owned: map[int32]*lane{}, keys: map[string]*keyState{}, remembered: map[uint64]int64{},
		reads: map[int64]int{}, inFlightIDs: map[[16]byte]bool{}, acked: map[[16]byte]int64{},
		toWrite: map[[16]byte]write{}, pollWait: time.Millisecond,
	}
}

// tickEvery is how often the lanes are renewed and rebalanced.
func (l *loop) tickEvery() time.Duration { return min(l.r.cfg.Lease/3, time.Second) }

func (l *loop) run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		l.schedule(ctx)
		wake := l.nextWake()
		timer.Reset(max(time.Until(wake), 0))
		select {
		case f := <-l.events:
			f()
		case <-l.nudge:
			l.pollWait = time.Millisecond
			l.nextPoll = time.Now()
		case <-timer.C:
		case <-ctx.Done():
			l.shutdown()
			return ctx.Err()
		}
	}
}

// nextWake is the earliest moment something is due.
func (l *loop) nextWake() time.Time {
	wake := time.Now().Add(time.Second)
	consider := func(t time.Time) {
		if !t.IsZero() && t.Before(wake) {
			wake = t
		}
	}
	if !l.ticking {
		consider(l.nextTick)
	}
	if !l.fetching && l.cursorValid {
		consider(l.nextPoll)
	}
	if len(l.later) > 0 {
		consider(l.later[0].retryAt)
	}
	if l.pausedUntil.After(time.Now()) {
		consider(l.pausedUntil)
	}
	if len(l.toWrite) > 0 && !l.writing {
		consider(l.writeRetryAt)
	}
	if !l.catching {
		consider(l.catchRetryAt)
	}
	for _, ln := range l.owned {
		consider(ln.validUntil) // dispatching stops there, and the write-off of a lost lease follows
	}
	return wake
}

// schedule starts whatever can start now.
func (l *loop) schedule(ctx context.Context) {
	now := time.Now()
	if !l.ticking && !now.Before(l.nextTick) {
		l.tick(ctx)
	}
	for len(l.later) > 0 && !l.later[0].retryAt.After(now) {
		ks := heap.Pop(&l.later).(*keyState)
		ks.waiting = false
		l.makeReady(ks)
	}
	if !l.fetching && l.cursorValid && len(l.owned) > 0 && !now.Before(l.nextPoll) && l.room() > 0 {
		l.fetch(ctx)
	}
	if !l.catching && l.cursorValid && l.room() > 0 && !now.Before(l.catchRetryAt) {
		l.catchUp(ctx)
	}
	for l.inFlight < l.r.cfg.MaxInFlight && !l.pausedUntil.After(now) {
		if !l.publish(now) {
			break
		}
	}
	if !l.writing && len(l.toWrite) > 0 && !now.Before(l.writeRetryAt) {
		l.flush()
	}
}

// room is how many more messages the loop may hold.
func (l *loop) room() int { return min(1000, l.r.cfg.MaxPending-l.pending) }

// post hands f to the loop, from one of its helper goroutines; after the loop stopped, f is
// dropped.
func (l *loop) post(f func()) {
	select {
	case l.events <- f:
	case <-l.done:
	}
}

// shutdown waits for the batches in flight, writes what they published, and gives the lanes up.
func (l *loop) shutdown() {
	defer close(l.done)
	l.stopping = true
	deadline := time.Now().Add(l.r.cfg.PublishTimeout + 5*time.Second)
	for (l.inFlight > 0 || l.writing || l.fetching || l.catching || l.ticking) && time.Now().Before(deadline) {
		select {
		case f := <-l.events:
			f()
		case <-time.After(time.Until(deadline)):
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if len(l.toWrite) > 0 && !l.writing {
		writes := l.takeWrites()
		if _, _, err := l.r.st.OutboxWriteAll(ctx, l.r.db, l.held(), plain(writes)); err != nil {
			l.r.cfg.Logger.WarnContext(ctx, "outbox: relay could not record what it published before it stopped; the messages will be published again, under the same ids",
				"relay", l.r.cfg.Name, "messages", len(writes), "error", err)
		}
	}
	var release []store.LaneToken
	for _, ln := range l.owned {
		release = append(release, store.LaneToken{Lane: ln.id, Token: ln.token, Floor: l.floor(ln)})
	}
	if len(release) > 0 {
		if err := l.r.st.OutboxRelease(ctx, l.r.db, l.r.cfg.Name, release); err != nil {
			l.r.cfg.Logger.WarnContext(ctx, "outbox: relay could not give its lanes up; they move when its lease runs out",
				"relay", l.r.cfg.Name, "error", err)
		}
	}
	_ = l.r.st.OutboxLeave(ctx, l.r.db, l.r.cfg.Name)
}

func plain(ws []write) []store.OutboxWrite {
	out := make([]store.OutboxWrite, len(ws))
	for i, w := range ws {
		out[i] = w.OutboxWrite
	}
	return out
}

// floor is the position up to which every message of ln is settled, and below which no
// transaction can still add one, as far as this loop knows: where a new owner starts reading.
func (l *loop) floor(ln *lane) int64 {
	lowest := int64(math.MaxInt64)
	note := func(pos int64) { lowest = min(lowest, pos) }
	if ln.catching {
		note(ln.catchPos + 1)
	} else {
		note(l.cursor + 1)
	}
	for _, bound := range l.remembered {
		note(bound + 1)
	}
	note(l.unlistedPos + 1)
	if ln.dropped > 0 {
		note(ln.dropped)
	}
	for _, ks := range l.keys {
		if ks.lane != ln.id {
			continue
		}
		if ks.inflight != nil {
			note(ks.inflight.row.Pos)
		}
		if len(ks.queue) > 0 {
			note(ks.queue[0].row.Pos)
		}
		if ks.gapFrom > 0 {
			note(ks.gapFrom)
		}
	}
	// Published but not yet recorded: a new owner must read them, or they stay unpublished in
	// the table (at the broker they are; publishing them again is a duplicate with the same id).
	for _, w := range l.toWrite {
		if w.Lane == ln.id {
			note(w.pos)
		}
	}
	for _, w := range l.writingNow {
		if w.Lane == ln.id {
			note(w.pos)
		}
	}
	if lowest == math.MaxInt64 {
		return ln.floor
	}
	return max(lowest-1, 0)
}

// held lists the lanes the loop holds, with their tokens, for a fenced write.
func (l *loop) held() []store.LaneToken {
	out := make([]store.LaneToken, 0, len(l.owned))
	for _, ln := range l.owned {
		out = append(out, store.LaneToken{Lane: ln.id, Token: ln.token})
	}
	return out
}

// retryHeap orders keys by when their backoff ends.
type retryHeap []*keyState

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].retryAt.Before(h[j].retryAt) }
func (h retryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *retryHeap) Push(x any)        { *h = append(*h, x.(*keyState)) }
func (h *retryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// dbBackoff paces retries of a read, write or renewal that failed.
var dbBackoff = backoff.Jitter{Min: 50 * time.Millisecond, Max: 2 * time.Second}
