package outbox

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/store"
)

// keyQueueCap bounds how many messages of one key the loop holds; later ones are read again
// when the key gets there. A key whose head is stopped holds its head alone.
const keyQueueCap = 1000

// entry is a message the loop holds.
type entry struct {
	row     store.OutboxRow
	created time.Time // when it was appended, as an instant of this process's clock
}

// keyState is what the loop knows of one key (or of one message without a key): the messages
// it holds, in position order, and the one in flight.
type keyState struct {
	id       string
	lane     int32
	queue    []*entry
	inflight *entry
	flyLane  *lane // the lane inflight was published from, which counts it
	attempts int   // failed attempts of the head
	retryAt  time.Time
	ready    bool // in l.ready
	waiting  bool // in l.later
	gapFrom  int64
}

func (ks *keyState) stopped() bool { return len(ks.queue) > 0 && ks.queue[0].row.Status == "stopped" }

// keyID names a key's state; a message without a key is a key of its own (NUL cannot occur in
// a key).
func keyID(r *store.OutboxRow) string {
	if r.Key == "" {
		return "\x00" + string(r.ID[:])
	}
	return r.Key
}

// add takes rows read by a read that started at epoch, when the database's clock said nowUS and
// this process's said at.
func (l *loop) add(rows []store.OutboxRow, nowUS int64, at time.Time, epoch int64) {
	for i := range rows {
		row := rows[i]
		ln := l.owned[row.Hash%int32(l.lanes)]
		if ln != nil && ln.draining {
			ln.drop(row.Pos) // its next owner reads it
			continue
		}
		if ln == nil || l.inFlightIDs[row.ID] {
			continue
		}
		if stamp, ok := l.acked[row.ID]; ok && (stamp == 0 || stamp > epoch) {
			continue // published; the read started before that was written
		}
		id := keyID(&row)
		ks := l.keys[id]
		if ks == nil {
			ks = &keyState{id: id, lane: ln.id}
			l.keys[id] = ks
		}
		if ks.inflight != nil && row.Pos <= ks.inflight.row.Pos {
			continue
		}
		idx := sort.Search(len(ks.queue), func(i int) bool { return ks.queue[i].row.Pos >= row.Pos })
		if idx < len(ks.queue) && ks.queue[idx].row.Pos == row.Pos {
			ks.queue[idx].row = row // read again: take its status and attempts as they are now
			continue
		}
		limit := keyQueueCap
		if ks.stopped() {
			limit = 1
		}
		if len(ks.queue) >= limit && idx > 0 {
			if ks.gapFrom == 0 || row.Pos < ks.gapFrom {
				ks.gapFrom = row.Pos
			}
			continue
		}
		e := &entry{row: row, created: at0(at, nowUS, row.CreatedUS)}
		ks.queue = append(ks.queue, nil)
		copy(ks.queue[idx+1:], ks.queue[idx:])
		ks.queue[idx] = e
		l.pending++
		if idx == 0 && row.Status == "stopped" {
			ks.attempts = row.Attempts
		}
		l.makeReady(ks)
	}
}

// at0 converts a creation time by the database's clock into this process's clock.
func at0(at time.Time, nowUS, createdUS int64) time.Time {
	return at.Add(-time.Duration(nowUS-createdUS) * time.Microsecond)
}

// dispatchable reports whether ks can publish its head now, and if not, whether a backoff is
// what it waits for.
func (l *loop) dispatchable(ks *keyState, now time.Time) (ok, backingOff bool) {
	ln := l.owned[ks.lane]
	switch {
	case l.keys[ks.id] != ks, ln == nil, ln.draining, !now.Before(ln.validUntil), ks.inflight != nil,
		len(ks.queue) == 0, ks.stopped(), ln.catching && ks.queue[0].row.Pos > ln.catchPos:
		return false, false
	case ks.retryAt.After(now):
		return false, true
	}
	return true, false
}

// makeReady queues ks to publish if it can, or to wait out its backoff. Keys that cannot for
// another reason are looked at again when that changes (a lane caught up or renewed).
func (l *loop) makeReady(ks *keyState) {
	if ks.ready || ks.waiting {
		return
	}
	ok, backingOff := l.dispatchable(ks, time.Now())
	switch {
	case ok:
		ks.ready = true
		l.ready = append(l.ready, ks)
	case backingOff:
		ks.waiting = true
		heap.Push(&l.later, ks)
	}
}

// readyLane looks again at every key of ln.
func (l *loop) readyLane(ln int32) {
	for _, ks := range l.keys {
		if ks.lane == ln {
			l.makeReady(ks)
		}
	}
}

// forget drops ks when it holds nothing, or reads its gap again when it has emptied.
func (l *loop) forget(ks *keyState) {
	if ks.inflight != nil || len(ks.queue) > 0 || l.keys[ks.id] != ks {
		return
	}
	if ks.gapFrom > 0 {
		if ln := l.owned[ks.lane]; ln != nil {
			l.rewind(ln, ks.gapFrom-1)
		}
	}
	delete(l.keys, ks.id)
}

// publish starts a batch of the keys ready now, one message per key; it reports whether it
// started one.
func (l *loop) publish(now time.Time) bool {
	if l.stopping {
		return false
	}
	var (
		keys  []*keyState
		batch []*Envelope
	)
	for len(l.ready) > 0 && len(batch) < l.r.cfg.BatchSize {
		ks := l.ready[0]
		l.ready[0] = nil
		l.ready = l.ready[1:]
		ks.ready = false
		if ok, _ := l.dispatchable(ks, now); !ok {
			l.makeReady(ks) // to the backoff heap, if that is what it waits for
			continue
		}
		e := ks.queue[0]
		ks.queue = ks.queue[1:]
		ks.inflight = e
		l.inFlightIDs[e.row.ID] = true
		ks.flyLane = l.owned[ks.lane]
		ks.flyLane.inflight++
		keys = append(keys, ks)
		batch = append(batch, &Envelope{ID: uuid.UUID(e.row.ID), Topic: e.row.Topic, Key: e.row.Key, Seq: e.row.Seq,
			Payload: e.row.Payload, Headers: e.row.Headers, Created: time.UnixMicro(e.row.CreatedUS), Attempt: ks.attempts + 1})
	}
	if len(batch) == 0 {
		return false
	}
	l.inFlight++
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.r.cfg.PublishTimeout)
		defer cancel()
		ctx, span := l.r.tel.tracer.Start(ctx, "idem.outbox.publish", trace.WithSpanKind(trace.SpanKindProducer))
		errs := l.r.pub.Publish(ctx, batch)
		if errs != nil && len(errs) != len(batch) {
			err := fmt.Errorf("outbox: the publisher returned %d results for %d messages", len(errs), len(batch))
			errs = make([]error, len(batch))
			for i := range errs {
				errs[i] = err
			}
		}
		if span.IsRecording() {
			failed := 0
			for _, err := range errs {
				if err != nil {
					failed++
				}
			}
			span.SetAttributes(attribute.Int("idem.outbox.messages", len(batch)), attribute.Int("idem.outbox.failed", failed))
			if failed > 0 {
				span.SetStatus(codes.Error, fmt.Sprintf("%d of %d messages failed", failed, len(batch)))
			}
		}
		span.End()
		l.post(func() { l.published(keys, errs) })
	}()
	return true
}

// published applies what the broker said of a batch.
func (l *loop) published(keys []*keyState, errs []error) {
	l.inFlight--
	now := time.Now()
	unavailable := false
	for i, ks := range keys {
		e := ks.inflight
		ks.inflight = nil
		delete(l.inFlightIDs, e.row.ID)
		l.pending--
		ks.flyLane.inflight--
		ln := l.owned[ks.lane]
		if ln != ks.flyLane || l.keys[ks.id] != ks {
			continue // the lane was lost meanwhile; its new owner publishes again
		}
		var err error
		if errs != nil {
			err = errs[i]
		}
		ctx := context.Background()
		switch {
		case err == nil:
			l.acked[e.row.ID] = 0
			l.toWrite[e.row.ID] = write{store.OutboxWrite{ID: e.row.ID, Lane: ks.lane, Published: true, Attempts: ks.attempts}, e.row.Pos}
			ks.attempts = 0
			l.r.tel.count(ctx, l.r.tel.published, e.row.Topic)
		case isUnavailable(err):
			l.requeue(ks, e)
			unavailable = true
			if l.unavailable == 0 {
				l.r.cfg.Logger.Warn("outbox: the broker is unavailable; the relay waits for it", "relay", l.r.cfg.Name, "error", err)
			}
		default:
			l.failed(ks, e, err, now)
		}
		l.makeReady(ks)
		l.forget(ks)
	}
	if unavailable {
		l.unavailable++
		l.pausedUntil = now.Add(backoff.Jitter{Min: 100 * time.Millisecond, Max: 5 * time.Second}.Wait(l.unavailable))
	} else if len(keys) > 0 {
		l.unavailable = 0
	}
}

// requeue puts e back at the head of its key.
func (l *loop) requeue(ks *keyState, e *entry) {
	ks.queue = append([]*entry{e}, ks.queue...)
	l.pending++
}

// failed applies the failure policy to a message the broker refused.
func (l *loop) failed(ks *keyState, e *entry, err error, now time.Time) {
	ctx := context.Background()
	ks.attempts++
	e.row.Attempts = ks.attempts
	e.row.LastError = err.Error()
	l.r.tel.count(ctx, l.r.tel.failed, e.row.Topic)
	p := l.r.cfg.policy(e.row.Topic)
	w := write{store.OutboxWrite{ID: e.row.ID, Lane: ks.lane, Attempts: ks.attempts, Error: clip(err.Error())}, e.row.Pos}
	switch {
	case ks.attempts < p.MaxAttempts:
		l.requeue(ks, e)
		ks.retryAt = now.Add(backoff.Jitter{Min: p.MinBackoff, Max: p.MaxBackoff}.Wait(ks.attempts))
	case p.DeadLetter:
		w.Status = "dead"
		ks.attempts = 0
		l.r.tel.count(ctx, l.r.tel.dead, e.row.Topic)
		l.r.cfg.Logger.Warn("outbox: message dead-lettered after its last attempt; its key goes on without it",
			"relay", l.r.cfg.Name, "id", uuid.UUID(e.row.ID).String(), "topic", e.row.Topic, "key", e.row.Key,
			"attempts", w.Attempts, "error", err)
	default:
		w.Status = "stopped"
		e.row.Status = "stopped"
		l.requeue(ks, e)
		// The key waits for an operator: hold its head alone, and read the rest again then.
		for _, rest := range ks.queue[1:] {
			if ks.gapFrom == 0 || rest.row.Pos < ks.gapFrom {
				ks.gapFrom = rest.row.Pos
			}
			l.pending--
		}
		ks.queue = ks.queue[:1]
		l.r.tel.count(ctx, l.r.tel.stopped, e.row.Topic)
		l.r.cfg.Logger.Warn("outbox: key stopped: its message failed every attempt, and its later messages wait; fix the cause, then retry it (idem outbox retry ID) or skip it (idem outbox skip ID)",
			"relay", l.r.cfg.Name, "id", uuid.UUID(e.row.ID).String(), "topic", e.row.Topic, "key", e.row.Key,
			"attempts", w.Attempts, "error", err)
	}
	l.toWrite[e.row.ID] = w
}

func isUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// clip makes a broker's error storable as text: valid UTF-8 without NUL bytes, at most 2000
// bytes cut on a rune boundary. Postgres refuses anything else, and a refused error would fail
// the write of every message recorded with it.
func clip(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) <= 2000 {
		return s
	}
	cut := 2000
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// takeWrites moves the writes to record into l.writingNow and returns them.
func (l *loop) takeWrites() []write {
	ws := make([]write, 0, len(l.toWrite))
	for _, w := range l.toWrite {
		ws = append(ws, w)
	}
	clear(l.toWrite)
	return ws
}

// flush records the writes, fenced by the lanes held.
func (l *loop) flush() {
	ws := l.takeWrites()
	l.writingNow = ws
	l.writing = true
	held := l.held()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		still, _, err := l.r.st.OutboxWriteAll(ctx, l.r.db, held, plain(ws))
		l.post(func() { l.written(ws, held, still, err) })
	}()
}

// written applies the outcome of a write.
func (l *loop) written(ws []write, held []store.LaneToken, still []int32, err error) {
	l.writing = false
	l.writingNow = nil
	if err != nil {
		for _, w := range ws {
			if _, newer := l.toWrite[w.ID]; !newer && l.owned[w.Lane] != nil {
				l.toWrite[w.ID] = w
			}
		}
		l.writeFails++
		l.writeRetryAt = time.Now().Add(dbBackoff.Wait(l.writeFails))
		if l.writeFails == 1 || l.writeFails%20 == 0 {
			l.r.cfg.Logger.Warn("outbox: relay cannot record what it published; retrying", "relay", l.r.cfg.Name, "failures", l.writeFails, "error", err)
		}
		return
	}
	l.writeFails = 0
	l.readEpoch++
	kept := map[int32]bool{}
	for _, ln := range still {
		kept[ln] = true
	}
	for _, w := range ws {
		if _, ok := l.acked[w.ID]; !ok || !w.Published {
			continue
		}
		if kept[w.Lane] {
			l.acked[w.ID] = l.readEpoch
		} else {
			delete(l.acked, w.ID) // not recorded: whoever owns the lane publishes it again
		}
	}
	for _, h := range held {
		if ln := l.owned[h.Lane]; ln != nil && ln.token == h.Token && !kept[h.Lane] && !ln.draining {
			l.lose(ln, "a write found its lease gone")
		}
	}
	l.pruneAcked()
}

// pruneAcked forgets acknowledged messages once no read that started before their write is
// outstanding.
func (l *loop) pruneAcked() {
	oldest := l.readEpoch
	for epoch, n := range l.reads {
		if n > 0 && epoch < oldest {
			oldest = epoch
		}
	}
	for id, stamp := range l.acked {
		if stamp != 0 && stamp <= oldest {
			delete(l.acked, id)
		}
	}
}
