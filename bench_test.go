package idem_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
)

// BenchmarkTransfer compares a realistic business transaction, a transfer between two of 1,000
// accounts (two UPDATEs and one INSERT into a ledger), run bare, inside idem.Do with fresh keys,
// through idem.Run with fresh keys, and as replays of completed keys, at 1 and 8 clients. Ratios
// between the variants of one run are what to compare; scripts/bench prints them.
func BenchmarkTransfer(b *testing.B) {
	ctx := context.Background()
	url := pgtemp.NewDB(b)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(b, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	require.NoError(b, idem.Migrate(ctx, pool))
	_, err = pool.Exec(ctx, `
		CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO accounts SELECT i, 1000000 FROM generate_series(1, 1000) i;
		CREATE TABLE ledger (id bigserial PRIMARY KEY, debit int NOT NULL, credit int NOT NULL,
			amount bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());`)
	require.NoError(b, err)

	type receipt struct{ LedgerID int64 }
	transfer := func(ctx context.Context, tx pgx.Tx) (receipt, error) {
		from, to := 1+rand.IntN(1000), 1+rand.IntN(999)
		if to >= from {
			to++
		}
		// Lock the two rows in id order, as a real service must to avoid deadlocks.
		lo, hi, amount := min(from, to), max(from, to), int64(1+rand.IntN(100))
		if lo != from {
			amount = -amount
		}
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - $1 WHERE id = $2`, amount, lo); err != nil {
			return receipt{}, err
		}
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, amount, hi); err != nil {
			return receipt{}, err
		}
		var r receipt
		err := tx.QueryRow(ctx, `INSERT INTO ledger (debit, credit, amount) VALUES ($1, $2, $3) RETURNING id`, from, to, amount).Scan(&r.LedgerID)
		return r, err
	}
	freshKey := func() idem.Key { return idem.Key{Scope: "bench", ID: uuid.Must(uuid.NewV7()).String()} }

	// Keys to replay, completed once up front.
	replayKeys := make([]idem.Key, 1000)
	for i := range replayKeys {
		replayKeys[i] = freshKey()
		_, err := idem.Run(ctx, pool, replayKeys[i], transfer)
		require.NoError(b, err)
	}

	variants := []struct {
		name string
		op   func(ctx context.Context, i int) error
	}{
		{"bare", func(ctx context.Context, _ int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := transfer(ctx, tx); return err })
		}},
		{"do", func(ctx context.Context, _ int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := idem.Do(ctx, tx, freshKey(), transfer)
				return err
			})
		}},
		{"run", func(ctx context.Context, _ int) error {
			_, err := idem.Run(ctx, pool, freshKey(), transfer)
			return err
		}},
		{"replay", func(ctx context.Context, i int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := idem.Do(ctx, tx, replayKeys[i%len(replayKeys)], transfer)
				return err
			})
		}},
	}
	cpu := newCPUMeter(ctx, pool)
	for _, clients := range []int{1, 8} {
		for _, v := range variants {
			b.Run(fmt.Sprintf("clients=%d/%s", clients, v.name), func(b *testing.B) {
				runClients(b, clients, cpu, func(i int) error { return v.op(ctx, i) })
			})
		}
	}
}

// runClients shares b.N operations among n goroutines, each standing for one client with its
// own connection, and reports throughput and, where it can be read, the CPU time spent per
// operation by this process and the Postgres server together. CPU per operation is the figure
// that other load on a shared machine disturbs least.
func runClients(b *testing.B, n int, cpu *cpuMeter, op func(i int) error) {
	before := cpu.read()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	b.ResetTimer()
	for range n {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(int(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
	if after := cpu.read(); before > 0 && after > before {
		b.ReportMetric(float64((after-before).Microseconds())/float64(b.N), "cpu-µs/tx")
	}
}
