package store_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/store"
)

// benchPool is a database of its own with idem migrated (today's partitions made).
func benchPool(b *testing.B) *pgxpool.Pool {
	pool := pgtemp.NewPool(b)
	if err := idem.Migrate(context.Background(), pool); err != nil {
		b.Fatal(err)
	}
	return pool
}

var benchSizes = []struct {
	name string
	n    int
}{{"16B", 16}, {"4KiB", 4 << 10}, {"64KiB", 64 << 10}}

// BenchmarkOutboxAppend measures a transaction that appends one keyed message and commits, by
// body size: "partition" is Append as it is (a body over PayloadInlineMax to today's partition),
// "inline" the same message written by the small message's statement, as before
// (SetPayloadInlineMax). The variants take turns within a run; run it a few times over:
//
//	for r in 1 2 3; do go test -run '^$' -bench OutboxAppend ./internal/store/; done
func BenchmarkOutboxAppend(b *testing.B) {
	ctx := context.Background()
	pool := benchPool(b)
	st := store.For("")
	for _, size := range benchSizes {
		for _, mode := range []string{"partition", "inline"} {
			if size.n <= store.PayloadInlineMax && mode == "inline" {
				continue // one statement either way
			}
			b.Run(size.name+"/"+mode, func(b *testing.B) {
				if mode == "inline" {
					defer store.SetPayloadInlineMax(1 << 30)()
				}
				data := body(size.n)
				b.SetBytes(int64(size.n))
				for i := 0; b.Loop(); i++ {
					m := msg("k" + strconv.Itoa(i%100))
					m.Payload = data
					stmt, err := st.OutboxAppend([]store.OutboxMessage{m})
					if err != nil {
						b.Fatal(err)
					}
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						_, err := tx.Exec(ctx, stmt.SQL, stmt.Args...)
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkOutboxFetch measures the relay's read of 100 unsettled messages, by body size, with
// the large bodies in today's partition ("partition": Fetch and one more statement) or in their
// rows ("inline", as before).
//
//	for r in 1 2 3; do go test -run '^$' -bench OutboxFetch ./internal/store/; done
func BenchmarkOutboxFetch(b *testing.B) {
	ctx := context.Background()
	pools := map[string]*pgxpool.Pool{"partition": benchPool(b), "inline": benchPool(b)}
	st := store.For("")
	for _, size := range benchSizes {
		// Each size has messages of its own, in a lane of its own.
		lane := int32(len(size.name))
		for mode, pool := range pools {
			data := body(size.n)
			for i := range 100 {
				m := msg("k" + strconv.Itoa(i%10))
				m.Payload, m.Hash = data, lane
				restore := func() {}
				if mode == "inline" {
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
	for _, size := range benchSizes {
		for _, mode := range []string{"partition", "inline"} {
			if size.n <= store.PayloadInlineMax && mode == "inline" {
				continue
			}
			lane := int32(len(size.name))
			b.Run(size.name+"/"+mode, func(b *testing.B) {
				p := store.OutboxFetchParams{Limit: 100, Lanes: 8, Live: []int32{lane}, Owned: []int32{lane}, From: 1 << 40}
				b.SetBytes(int64(100 * size.n))
				for b.Loop() {
					f, err := st.OutboxFetch(ctx, pools[mode], p)
					if err != nil {
						b.Fatal(err)
					}
					if len(f.New) != 100 || len(f.New[99].Payload) != size.n {
						b.Fatalf("read %d messages", len(f.New))
					}
				}
			})
		}
	}
}
