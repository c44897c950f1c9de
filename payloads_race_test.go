package idem_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

// TestLargeDoWhileItsPartitionIsAttached: large Do's that run while the partition of their day is
// being attached all succeed, each result stored either inline or in the partition: the result is
// written into its partition by name, never routed through idem_results with a list of
// partitions taken before the attach.
func TestLargeDoWhileItsPartitionIsAttached(t *testing.T) {
	b := setup(t)
	ctx := b.ctx
	var today time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today))
	var (
		failures []string
		mu       sync.Mutex
		seq      atomic.Int64
		ok       atomic.Int64
		tries    atomic.Int64 // Do's that returned, either way
	)
	// progress waits until n more Do's have returned than had when it was called: writers are in
	// flight around the attach, on however slow a machine.
	progress := func(n int64) {
		for want := tries.Load() + n; tries.Load() < want; {
			time.Sleep(time.Millisecond)
		}
	}
	for d := 20; d < 140; d++ {
		day := today.AddDate(0, 0, d)
		ttl := time.Duration(d) * 24 * time.Hour
		var stop atomic.Bool
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					key := idem.Key{Scope: "race", ID: fmt.Sprintf("k%d", seq.Add(1))}
					_, err := idem.Run(ctx, b.pool, key, func(context.Context, pgx.Tx) (string, error) {
						return bigBody(2000, key.ID), nil
					}, idem.TTL(ttl))
					if err != nil {
						mu.Lock()
						failures = append(failures, err.Error())
						mu.Unlock()
					} else {
						ok.Add(1)
					}
					tries.Add(1)
				}
			}()
		}
		progress(8)
		require.NoError(t, store.For("").MakePartitions(ctx, b.pool, "idem_results", day, day))
		progress(8)
		stop.Store(true)
		wg.Wait()
	}
	t.Logf("%d Do's succeeded, %d failed", ok.Load(), len(failures))
	require.GreaterOrEqual(t, tries.Load(), int64(120*16), "writers ran before and after each attach")
	if len(failures) > 0 {
		t.Fatalf("large Do's failed while their day's partition was attached: %d, e.g. %s", len(failures),
			strings.Join(failures[:min(3, len(failures))], " | "))
	}
}
