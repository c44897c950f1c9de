// Package outboxcheck is what the outbox's tests share, in package outbox and in the publisher
// modules: writers that append messages over many keys, and a ledger of what a consumer received
// that checks the outbox's promises (nothing lost, each key in order, repeats only under the same
// id).
package outboxcheck

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/tx"
)

// Delivery is one message as a consumer received it.
type Delivery struct {
	ID  string
	Key string
	Seq int64
}

// Ledger records deliveries; it is safe for concurrent use.
type Ledger struct {
	mu    sync.Mutex
	order map[string][]Delivery // by key, in the order received
	count map[string]int        // by id
	total int
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{order: map[string][]Delivery{}, count: map[string]int{}}
}

// Record notes a delivery.
func (l *Ledger) Record(d Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.order[d.Key] = append(l.order[d.Key], d)
	l.count[d.ID]++
	l.total++
}

// RecordEnvelope notes an envelope as a publisher sent it.
func (l *Ledger) RecordEnvelope(e *outbox.Envelope) {
	l.Record(Delivery{ID: e.ID.String(), Key: e.Key, Seq: e.Seq})
}

// Has reports whether id was delivered.
func (l *Ledger) Has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count[id] > 0
}

// Distinct is how many different ids were delivered.
func (l *Ledger) Distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.count)
}

// Keys returns the deliveries of key, in the order received.
func (l *Ledger) Keys(key string) []Delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Delivery(nil), l.order[key]...)
}

// Report is what Check found.
type Report struct {
	Delivered  int // deliveries, repeats included
	Distinct   int // different ids
	Repeats    int // deliveries of an id seen before
	Lost       int // expected ids never delivered
	OutOfOrder int // keyed deliveries whose first arrival did not follow the key's previous one
	BadRepeats int // a key's sequence number seen again under another id
	Problems   []string
}

// OK reports whether nothing was lost, out of order or repeated under another id.
func (r Report) OK() bool { return r.Lost == 0 && r.OutOfOrder == 0 && r.BadRepeats == 0 }

func (r Report) String() string {
	return fmt.Sprintf("%d delivered, %d distinct, %d repeats (same id), %d lost, %d out of order, %d repeats under another id %v",
		r.Delivered, r.Distinct, r.Repeats, r.Lost, r.OutOfOrder, r.BadRepeats, r.Problems)
}

// Check compares the deliveries with the ids that were appended (committed): each must arrive,
// and each key's sequence numbers must first arrive in order without a gap (1, 2, 3, ... from
// the key's first one).
func (l *Ledger) Check(want []uuid.UUID) Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := Report{Delivered: l.total, Distinct: len(l.count)}
	problem := func(format string, args ...any) {
		if len(r.Problems) < 10 {
			r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
		}
	}
	for _, id := range want {
		if l.count[id.String()] == 0 {
			r.Lost++
			problem("lost %s", id)
		}
	}
	for _, n := range l.count {
		r.Repeats += n - 1
	}
	keys := make([]string, 0, len(l.order))
	for k := range l.order {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if key == "" {
			continue
		}
		seen := map[int64]string{}
		var last int64
		for _, d := range l.order[key] {
			if id, ok := seen[d.Seq]; ok {
				if id != d.ID {
					r.BadRepeats++
					problem("key %q seq %d arrived as %s and as %s", key, d.Seq, id, d.ID)
				}
				continue
			}
			seen[d.Seq] = d.ID
			if last != 0 && d.Seq != last+1 {
				r.OutOfOrder++
				problem("key %q: seq %d arrived after %d", key, d.Seq, last)
			}
			last = d.Seq
		}
	}
	return r
}

// WaitFor polls cond until it holds, and fails tb after limit.
func WaitFor(tb testing.TB, limit time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("gave up after %s waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Writer appends messages for tests.
type Writer struct {
	DB      tx.Beginner
	Topic   string
	Keys    int    // messages go to keys "k0".."k<Keys-1>"; 0 means no key
	Prefix  string // goes before "k" in the keys
	PerTx   int    // messages per transaction; default 1
	Payload []byte
	Opts    []outbox.Option
}

// Write appends n messages in transactions of PerTx, keys drawn at random, and returns the ids
// of those that committed.
func (w *Writer) Write(ctx context.Context, n int) ([]uuid.UUID, error) {
	per := max(w.PerTx, 1)
	var out []uuid.UUID
	for done := 0; done < n; done += per {
		batch := make([]outbox.Message, min(per, n-done))
		for i := range batch {
			batch[i] = outbox.Message{Topic: w.Topic, Payload: w.Payload}
			if w.Keys > 0 {
				batch[i].Key = w.Prefix + "k" + strconv.Itoa(rand.IntN(w.Keys))
			}
		}
		var ids []uuid.UUID
		err := tx.Run(ctx, w.DB, func(ctx context.Context, t pgx.Tx) error {
			var err error
			ids, err = outbox.AppendBatch(ctx, t, batch, w.Opts...)
			return err
		})
		if err != nil {
			return out, err
		}
		out = append(out, ids...)
	}
	return out, nil
}
