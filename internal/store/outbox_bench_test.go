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

// inlineStmt is the statement that writes m with its body in its row whatever its size, as every
// Append did before large bodies went to idem_outbox_payloads: the small message's statement,
// with m's body.
func inlineStmt(tb testing.TB, st *store.Statements, m store.OutboxMessage) store.Stmt {
	small := m
	small.Payload = []byte("x")
	stmt, err := st.OutboxAppend([]store.OutboxMessage{small})
	if err != nil {
		tb.Fatal(err)
	}
	for i, a := range stmt.Args {
		if p, ok := a.([]byte); ok && string(p) == "x" {
			stmt.Args[i] = m.Payload
		}
	}
	return stmt
}

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
// "inline" the same message written by the small message's statement, as before. Run the
// variants interleaved over rounds:
//
//	go test -run '^$' -bench OutboxAppend -count 3 ./internal/store/
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
				data := body(size.n)
				b.SetBytes(int64(size.n))
				for i := 0; b.Loop(); i++ {
					m := msg("k" + strconv.Itoa(i%100))
					m.Payload = data
					stmt, err := st.OutboxAppend([]store.OutboxMessage{m})
					if mode == "inline" {
						stmt = inlineStmt(b, st, m)
					}
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
//	go test -run '^$' -bench OutboxFetch -count 3 ./internal/store/
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
				stmt, err := st.OutboxAppend([]store.OutboxMessage{m})
				if mode == "inline" {
					stmt = inlineStmt(b, st, m)
				}
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
