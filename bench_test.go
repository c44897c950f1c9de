package idem_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	txpkg "github.com/idemkit/idem/tx"
)

// BenchmarkTransfer compares a realistic business transaction, a transfer between two of 1,000
// accounts (two UPDATEs and one INSERT into a ledger), at 1 and 8 clients, run:
//
//   - bare: in pgx.BeginFunc, as a service without idem runs it;
//   - bare-txrun: in tx.Run, which sends BEGIN with the first statement;
//   - bare+2rt: bare with two `SELECT 1` round trips added, one before the transfer and one after:
//     the floor of any key table that looks a key up before the work and stores it after, in a
//     transaction the caller begins and commits itself (neither statement can travel with the
//     caller's BEGIN or COMMIT);
//   - hand: in pgx.BeginFunc with a hand-rolled key table, (key text PRIMARY KEY, response
//     jsonb): a SELECT of the key before, an INSERT of it after, the twenty lines a user would
//     otherwise write;
//   - do: idem.Do with fresh keys in pgx.BeginFunc (a caller's own transaction);
//   - do-txrun: idem.Do with fresh keys in tx.Run, as the README shows it;
//   - run: idem.Run with fresh keys;
//   - optimistic: idem.Run with idem.Optimistic and fresh keys;
//   - replay: idem.Do in pgx.BeginFunc with keys completed before.
//
// Ratios between the variants of one run are what to compare; scripts/bench prints them.
func BenchmarkTransfer(b *testing.B) {
	ctx := context.Background()
	pool := transferPool(b, 8)
	_, err := pool.Exec(ctx, `CREATE TABLE hand_keys (key text PRIMARY KEY, response jsonb)`)
	require.NoError(b, err)
	transfer := benchTransfer
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
		{"bare-txrun", func(ctx context.Context, _ int) error {
			return txpkg.Run(ctx, pool, func(ctx context.Context, tx pgx.Tx) error { _, err := transfer(ctx, tx); return err })
		}},
		{"bare+2rt", func(ctx context.Context, _ int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var one int
				if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
					return err
				}
				if _, err := transfer(ctx, tx); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `SELECT 1`)
				return err
			})
		}},
		{"hand", func(ctx context.Context, _ int) error {
			key := freshKey().ID
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var stored []byte
				err := tx.QueryRow(ctx, `SELECT response FROM hand_keys WHERE key = $1`, key).Scan(&stored)
				if err == nil {
					return nil // a replay
				}
				if !errors.Is(err, pgx.ErrNoRows) {
					return err
				}
				r, err := transfer(ctx, tx)
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `INSERT INTO hand_keys (key, response) VALUES ($1, $2)`, key, r)
				return err
			})
		}},
		{"do", func(ctx context.Context, _ int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := idem.Do(ctx, tx, freshKey(), transfer)
				return err
			})
		}},
		{"do-txrun", func(ctx context.Context, _ int) error {
			return txpkg.Run(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
				_, err := idem.Do(ctx, tx, freshKey(), transfer)
				return err
			})
		}},
		{"run", func(ctx context.Context, _ int) error {
			_, err := idem.Run(ctx, pool, freshKey(), transfer)
			return err
		}},
		{"optimistic", func(ctx context.Context, _ int) error {
			_, err := idem.Run(ctx, pool, freshKey(), transfer, idem.Optimistic())
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
	// scripts/bench runs one round per process and starts each with another variant
	// (BENCH_SHIFT), so that none always runs first, or always after the same one: on a shared
	// machine, position in a round shows in the numbers. (go test -count would not interleave:
	// it repeats each sub-benchmark in a row.)
	shift, _ := strconv.Atoi(os.Getenv("BENCH_SHIFT"))
	shift %= len(variants)
	variants = append(variants[shift:], variants[:shift]...)
	for _, clients := range benchClients() {
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
	beforeClient, beforeServer := cpu.split()
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
	if afterClient, afterServer := cpu.split(); beforeServer > 0 && afterServer > beforeServer {
		client, server := afterClient-beforeClient, afterServer-beforeServer
		b.ReportMetric(float64((client+server).Microseconds())/float64(b.N), "cpu-µs/tx")
		b.ReportMetric(float64(client.Microseconds())/float64(b.N), "client-µs/tx")
		b.ReportMetric(float64(server.Microseconds())/float64(b.N), "server-µs/tx")
	}
}

// benchClients are the client counts to run, from BENCH_CLIENTS ("1,8" by default).
func benchClients() []int {
	spec := os.Getenv("BENCH_CLIENTS")
	if spec == "" {
		spec = "1,8"
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			panic("BENCH_CLIENTS must list client counts, such as 1,8 (got " + spec + ")")
		}
		out = append(out, n)
	}
	return out
}
