package store_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/store"
)

// benchPool is a database of its own with idem migrated (today's partitions made), and in schema
// "old" migrated to version 10, before idem_outbox_payloads.
func benchPool(b *testing.B) *pgxpool.Pool {
	ctx := context.Background()
	pool := pgtemp.NewPool(b)
	err := idem.Migrate(ctx, pool)
	if err == nil {
		err = idem.MigrateTo(ctx, pool, 10, idem.Schema("old"))
	}
	if err != nil {
		b.Fatal(err)
	}
	return pool
}

var benchSizes = []struct {
	name string
	n    int
}{{"16B", 16}, {"4KiB", 4 << 10}, {"64KiB", 64 << 10}}

// variants times two ways of doing one thing, taking turns operation by operation so that
// whatever else the machine does weighs on both alike, and reports each one's mean and their
// ratio.
type variants struct {
	names [2]string
	total [2]time.Duration
	n     [2]int
}

func (v *variants) time(i int, f func()) {
	start := time.Now()
	f()
	v.total[i] += time.Since(start)
	v.n[i]++
}

func (v *variants) report(b *testing.B) {
	var mean [2]float64
	for i := range 2 {
		mean[i] = float64(v.total[i].Microseconds()) / float64(max(v.n[i], 1))
		b.ReportMetric(mean[i], v.names[i]+"-µs/op")
	}
	b.ReportMetric(mean[0]/mean[1], v.names[0]+"/"+v.names[1])
}

// BenchmarkOutboxAppend measures a transaction that appends one keyed message and commits, by
// body size, two ways in turn. For 4 KiB and 64 KiB, "partition" is Append as it is (the body to
// today's partition) and "inline" the same message written by the small message's statement, as
// before (SetPayloadInlineMax). For 16 B the statement is the same as before, and "new" writes
// it to tables at the latest version, "old" to tables of the same database at version 10, before
// idem_outbox_payloads.
//
//	go test -run '^$' -bench OutboxAppend -count 3 ./internal/store/
func BenchmarkOutboxAppend(b *testing.B) {
	ctx := context.Background()
	pool := benchPool(b)
	st, old := store.For(""), store.For("old")
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			small := size.n <= store.PayloadInlineMax
			v := &variants{names: [2]string{"partition", "inline"}}
			if small {
				v.names = [2]string{"new", "old"}
			}
			data := body(size.n)
			for i := 0; b.Loop(); i++ {
				m := msg("k" + strconv.Itoa(i%100))
				m.Payload = data
				which, s := i%2, st
				if which == 1 && small {
					s = old
				}
				restore := func() {}
				if which == 1 && !small {
					restore = store.SetPayloadInlineMax(1 << 30)
				}
				stmt, err := s.OutboxAppend([]store.OutboxMessage{m})
				restore()
				if err != nil {
					b.Fatal(err)
				}
				v.time(which, func() {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						_, err := tx.Exec(ctx, stmt.SQL, stmt.Args...)
						return err
					})
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			v.report(b)
		})
	}
}

// BenchmarkOutboxFetch measures the relay's read of 100 unsettled messages, by body size, with
// the large bodies in today's partition ("partition": Fetch and one more statement) or in their
// rows ("inline", written as before), the two in turn, from two lanes of one table. For 16 B
// both read rows written the same way: the difference is noise.
//
//	go test -run '^$' -bench OutboxFetch -count 3 ./internal/store/
func BenchmarkOutboxFetch(b *testing.B) {
	ctx := context.Background()
	pool := benchPool(b)
	st := store.For("")
	// Each size and variant has messages of its own, in a lane of its own.
	lane := func(size, which int) int32 { return int32(2*size + which) }
	for k, size := range benchSizes {
		for which := range 2 {
			data := body(size.n)
			for i := range 100 {
				m := msg("k" + strconv.Itoa(i%10))
				m.Payload, m.Hash = data, lane(k, which)
				restore := func() {}
				if which == 1 {
					restore = store.SetPayloadInlineMax(1 << 30)
				}
				stmt, err := st.OutboxAppend([]store.OutboxMessage{m})
				restore()
				if err == nil {
					_, err = pool.Exec(ctx, stmt.SQL, stmt.Args...)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	for k, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			v := &variants{names: [2]string{"partition", "inline"}}
			var p [2]store.OutboxFetchParams
			for which := range 2 {
				l := []int32{lane(k, which)}
				p[which] = store.OutboxFetchParams{Limit: 100, Lanes: 8, Live: l, Owned: l, From: 1 << 40}
			}
			for i := 0; b.Loop(); i++ {
				var (
					f   store.OutboxFetched
					err error
				)
				v.time(i%2, func() { f, err = st.OutboxFetch(ctx, pool, p[i%2]) })
				if err != nil {
					b.Fatal(err)
				}
				if len(f.New) != 100 || len(f.New[99].Payload) != size.n {
					b.Fatalf("read %d messages", len(f.New))
				}
			}
			v.report(b)
		})
	}
}
