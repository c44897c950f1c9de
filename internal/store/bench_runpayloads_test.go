package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/store"
)

// BenchmarkRunPayloadStatements measures a step's checkpoint (the write) and a run's history of
// three steps (the read on every resume) by output size, three ways, one op of each in turn so
// that their ratios hold on a machine whose load drifts:
//
//   - old: the statement as it was before large payloads moved (the small payloads' statement,
//     which every output used), the output inline;
//   - parted: the run's start day has its partition, and an output over 1 KiB goes there;
//   - inline: the same statement for a run whose start day has no partition, so the output
//     stays inline (written once through the large payloads' statement).
//
// Each reports its median time per op (the machines these run on are shared: a mean is at the
// mercy of a few ops that waited for a CPU); b.N counts rounds of one op of each.
//
//	go test -run '^$' -bench RunPayloadStatements -benchtime 2000x -count 3 ./internal/store/
func BenchmarkRunPayloadStatements(b *testing.B) {
	ctx := context.Background()
	pool := pgtemp.NewPool(b)
	if err := idem.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	st := store.For("")
	runs := 0
	// newRun makes a running run whose lease the caller holds, created ago before now (a day
	// with no partition when ago is a month).
	newRun := func(b *testing.B, ago time.Duration) (store.LeaseParams, int64) {
		runs++
		lease := store.LeaseParams{Scope: "bench", ID: fmt.Sprintf("r%d", runs), Token: newToken()}
		var created int64
		if err := pool.QueryRow(ctx, `WITH k AS (
	INSERT INTO idem_keys (scope, id, workflow, created_at, expires_at) VALUES ($1, $2, 'wf', now(), 'infinity')
)
INSERT INTO idem_runs (scope, id, workflow, state, attempts, lease_token, lease_owner, lease_expires_at, created_at, updated_at)
VALUES ($1, $2, 'wf', 'running', 1, $3, 'bench', now() + interval '1 hour', now() - $4::int8 * interval '1 microsecond', now())
RETURNING (extract(epoch FROM created_at) * 1000000)::int8`, lease.Scope, lease.ID, lease.Token, ago.Microseconds()).Scan(&created); err != nil {
			b.Fatal(err)
		}
		return lease, created
	}
	const month = 30 * 24 * time.Hour
	variants := []struct {
		name string
		ago  time.Duration
		old  bool
	}{{"old", 0, true}, {"parted", 0, false}, {"inline", month, false}}
	small := st.StepCheckpoint(store.CheckpointParams{Output: []byte(`1`)}).SQL
	checkpoint := func(b *testing.B, lease store.LeaseParams, created int64, seq int, out []byte, old bool) {
		s := st.StepCheckpoint(store.CheckpointParams{LeaseParams: lease, Seq: seq, Name: "s", Kind: "tx", Output: out, Attempts: 1, Created: created})
		if old {
			s.SQL = small
		}
		if _, err := s.Exec(ctx, pool); err != nil {
			b.Fatal(err)
		}
	}
	for _, size := range []struct {
		name string
		n    int
	}{{"small", 16}, {"1KiB", store.PayloadInlineMax}, {"4KiB", 4 << 10}, {"64KiB", 64 << 10}} {
		out := randomJSON(size.n)
		b.Run("checkpoint/"+size.name, func(b *testing.B) {
			type state struct {
				lease   store.LeaseParams
				created int64
				seq     int
				took    []time.Duration
			}
			states := make([]state, len(variants))
			for i, v := range variants {
				states[i].lease, states[i].created = newRun(b, v.ago)
				for range 3 {
					states[i].seq++
					checkpoint(b, states[i].lease, states[i].created, states[i].seq, out, v.old)
				}
			}
			b.ResetTimer()
			for n := range b.N {
				for k := range variants {
					i := (k + n) % len(variants)
					s := &states[i]
					s.seq++
					start := time.Now()
					checkpoint(b, s.lease, s.created, s.seq, out, variants[i].old)
					s.took = append(s.took, time.Since(start))
				}
			}
			meds := make([]time.Duration, len(variants))
			for i, v := range variants {
				meds[i] = median(states[i].took)
				b.ReportMetric(float64(meds[i].Nanoseconds())/1e3, v.name+"-µs/op")
			}
			b.ReportMetric(float64(meds[1])/float64(meds[0]), "parted/old")
		})
		b.Run("history/"+size.name, func(b *testing.B) {
			leases := make([]store.LeaseParams, len(variants))
			took := make([][]time.Duration, len(variants))
			for i, v := range variants {
				var created int64
				leases[i], created = newRun(b, v.ago)
				for seq := 1; seq <= 3; seq++ {
					checkpoint(b, leases[i], created, seq, out, v.old)
				}
			}
			read := func(lease store.LeaseParams) {
				h, err := st.RunHistory(ctx, pool, lease.Scope, lease.ID)
				if err != nil || len(h) != 3 || len(h[2].Output) != size.n {
					b.Fatal(err, len(h))
				}
			}
			for i := range variants {
				read(leases[i])
			}
			b.ResetTimer()
			for n := range b.N {
				for k := range variants {
					i := (k + n) % len(variants)
					start := time.Now()
					read(leases[i])
					took[i] = append(took[i], time.Since(start))
				}
			}
			meds := make([]time.Duration, len(variants))
			for i, v := range variants {
				meds[i] = median(took[i])
				b.ReportMetric(float64(meds[i].Nanoseconds())/1e3, v.name+"-µs/op")
			}
			b.ReportMetric(float64(meds[1])/float64(meds[0]), "parted/old")
		})
	}
}

// median is the middle of ds (which it sorts).
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// randomJSON is a JSON string of n bytes of pseudo-random letters, which compress about as well
// as real JSON does.
func randomJSON(n int) []byte {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	b[0], b[n-1] = '"', '"'
	return b
}
