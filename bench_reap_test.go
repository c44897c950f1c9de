package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
)

// benchSize reads a size from the environment, so that the big benchmarks below stay small
// unless asked for (go test -bench . runs every benchmark).
func benchSize(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// transferPool is a database with idem migrated and the accounts and ledger of BenchmarkTransfer,
// behind a pool of maxConns connections.
func transferPool(b *testing.B, maxConns int) *pgxpool.Pool {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtemp.NewDB(b))
	require.NoError(b, err)
	cfg.MaxConns = int32(maxConns)
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
	return pool
}

// seedExpired writes n expired keys of Do, as a service that never reaped would have left.
func seedExpired(b *testing.B, pool *pgxpool.Pool, n int) {
	ctx := context.Background()
	const chunk = 250_000
	for done := 0; done < n; done += chunk {
		_, err := pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, result, created_at, expires_at)
			SELECT 'bench', gen_random_uuid()::text, '{"LedgerID":1}', now() - interval '2 days', now() - interval '1 day' + i * interval '1 microsecond'
			FROM generate_series(1, $1::int) i`, min(chunk, n-done))
		require.NoError(b, err)
	}
	_, err := pool.Exec(ctx, `VACUUM ANALYZE idem_keys`)
	require.NoError(b, err)
}

// BenchmarkExpiredBacklog compares idem.Run with fresh keys on an empty key table and on one
// holding IDEM_BENCH_BACKLOG expired, unreaped keys (default 200,000; the figures in the README
// use 5,000,000), 8 clients, interleaved in IDEM_BENCH_ROUNDS rounds (default 3). Keys are
// UUIDv7, as idemhttp.Transport makes them, and random UUIDv4 (what many clients send).
//
//	IDEM_BENCH_BACKLOG=5000000 go test -run '^$' -bench ExpiredBacklog -benchtime 3s -timeout 30m .
func BenchmarkExpiredBacklog(b *testing.B) {
	const clients = 8
	empty := transferPool(b, clients+2)
	full := transferPool(b, clients+2)
	seedExpired(b, full, benchSize("IDEM_BENCH_BACKLOG", 200_000))
	ctx := context.Background()
	transfer := benchTransfer
	for round := range benchSize("IDEM_BENCH_ROUNDS", 3) {
		for _, keys := range []struct {
			name string
			new  func() string
		}{{"uuidv7", func() string { return uuid.Must(uuid.NewV7()).String() }}, {"uuidv4", uuid.NewString}} {
			for _, db := range []struct {
				name string
				pool *pgxpool.Pool
			}{{"empty", empty}, {"backlog", full}} {
				b.Run(fmt.Sprintf("round=%d/%s/%s", round+1, keys.name, db.name), func(b *testing.B) {
					runClients(b, clients, newCPUMeter(ctx, db.pool), func(int) error {
						_, err := idem.Run(ctx, db.pool, idem.Key{Scope: "bench", ID: keys.new()}, transfer)
						return err
					})
				})
			}
		}
	}
}

// BenchmarkReap measures the reaper against the traffic it shares the database with: 8 clients
// run idem.Do (each in its own transaction, a transfer, a fresh UUIDv7 key) flat out over a table
// holding IDEM_BENCH_BACKLOG expired keys (default 200,000; the README's figures use 300,000);
// after a quiet window the reaper drains the backlog with its defaults while the clients go on.
// In the same run it reports the reaper's rows/s, the clients' own keys/s while it worked and
// the ratio of the two (drain-x), and the clients' p50 and p99 without and with the reaper, with
// the ratio of the p99s (p99-x). IDEM_BENCH_REAP_BUSY and IDEM_BENCH_REAP_BATCH_MS set ReapBusy
// and ReapBatchTime instead of the defaults; IDEM_BENCH_REAP_WINDOW (seconds) alternates quiet
// windows and reaping windows of that length instead of one of each.
//
//	IDEM_BENCH_BACKLOG=300000 IDEM_BENCH_REAP_WINDOW=5 go test -run '^$' -bench '^BenchmarkReap$' -benchtime 1x -count 3 -timeout 30m .
func BenchmarkReap(b *testing.B) {
	const clients = 8
	ctx := context.Background()
	for range b.N {
		pool := transferPool(b, clients+2)
		backlog := benchSize("IDEM_BENCH_BACKLOG", 200_000)
		seedExpired(b, pool, backlog)
		transfer := benchTransfer

		var (
			mu        sync.Mutex
			latencies = map[string][]time.Duration{}
			phase     atomic.Value
			stop      atomic.Bool
			wg        sync.WaitGroup
			errs      = make(chan error, clients)
		)
		phase.Store("quiet")
		for range clients {
			wg.Go(func() {
				for !stop.Load() {
					start := time.Now()
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						_, err := idem.Do(ctx, tx, idem.Key{Scope: "bench", ID: uuid.Must(uuid.NewV7()).String()}, transfer)
						return err
					})
					if err != nil {
						errs <- err
						return
					}
					p := phase.Load().(string)
					mu.Lock()
					latencies[p] = append(latencies[p], time.Since(start))
					mu.Unlock()
				}
			})
		}
		var opts []idem.Option
		if busy, err := strconv.ParseFloat(os.Getenv("IDEM_BENCH_REAP_BUSY"), 64); err == nil {
			opts = append(opts, idem.ReapBusy(busy))
		}
		if ms, err := strconv.ParseFloat(os.Getenv("IDEM_BENCH_REAP_BATCH_MS"), 64); err == nil {
			opts = append(opts, idem.ReapBatchTime(time.Duration(ms*float64(time.Millisecond))))
		}
		// One quiet window, then one Reap that drains the backlog; or, with
		// IDEM_BENCH_REAP_WINDOW (seconds), quiet windows and Reap calls cut off after that long
		// in turn until the backlog is gone, so that whatever else loads the machine falls on
		// both sides alike.
		window, _ := strconv.ParseFloat(os.Getenv("IDEM_BENCH_REAP_WINDOW"), 64)
		var (
			err         error
			quiet, took time.Duration
			drained     bool
		)
		for !drained && err == nil {
			w := quietWindow
			if window > 0 {
				w = time.Duration(window * float64(time.Second))
			}
			time.Sleep(w) // the clients' latency without the reaper
			quiet += w
			phase.Store("reaping")
			start := time.Now()
			rctx, cancel := context.WithCancel(ctx)
			if window > 0 {
				rctx, cancel = context.WithTimeout(ctx, w)
			}
			// A call cut off may lose the count of a batch that committed as it was cancelled:
			// the backlog is drained when a call ends by itself.
			_, err = idem.Reap(rctx, pool, opts...)
			drained = err == nil
			if errors.Is(err, context.DeadlineExceeded) {
				err = nil
			}
			cancel()
			took += time.Since(start)
			phase.Store("quiet")
		}
		phase.Store("after")
		stop.Store(true)
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		require.NoError(b, err)
		var left int
		require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys WHERE expires_at <= now()`).Scan(&left))
		require.Zero(b, left, "the backlog is drained")
		n := backlog

		p := map[string]time.Duration{}
		for _, ph := range []string{"quiet", "reaping"} {
			l := latencies[ph]
			require.NotEmpty(b, l, "no Do finished in the %s phase", ph)
			slices.Sort(l)
			p[ph+"-p50"], p[ph+"-p99"] = l[len(l)/2], l[len(l)*99/100]
		}
		reaped := float64(n) / took.Seconds()
		keys := float64(len(latencies["reaping"])) / took.Seconds()
		b.ReportMetric(reaped, "reaped/s")
		b.ReportMetric(float64(len(latencies["quiet"]))/quiet.Seconds(), "quiet-keys/s")
		b.ReportMetric(keys, "reaping-keys/s")
		b.ReportMetric(reaped/keys, "drain-x")
		for _, k := range []string{"quiet-p50", "quiet-p99", "reaping-p50", "reaping-p99"} {
			b.ReportMetric(float64(p[k].Microseconds())/1000, k+"-ms")
		}
		b.ReportMetric(float64(p["reaping-p99"])/float64(p["quiet-p99"]), "p99-x")
		b.ReportMetric(took.Seconds(), "reap-s")
	}
}

// quietWindow is how long BenchmarkReap measures the clients before the reaper starts.
const quietWindow = 10 * time.Second

type benchReceipt struct{ LedgerID int64 }

// benchTransfer is BenchmarkTransfer's unit of work, a transfer between two of 1,000 accounts.
func benchTransfer(ctx context.Context, tx pgx.Tx) (benchReceipt, error) {
	from, to := 1+rand.IntN(1000), 1+rand.IntN(999)
	if to >= from {
		to++
	}
	// Lock the two rows in id order, as a real service must to avoid deadlocks.
	lo, hi, amount := min(from, to), max(from, to), int64(1+rand.IntN(100))
	if lo != from {
		amount = -amount
	}
	var r benchReceipt
	if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - $1 WHERE id = $2`, amount, lo); err != nil {
		return r, err
	}
	if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, amount, hi); err != nil {
		return r, err
	}
	err := tx.QueryRow(ctx, `INSERT INTO ledger (debit, credit, amount) VALUES ($1, $2, $3) RETURNING id`, from, to, amount).Scan(&r.LedgerID)
	return r, err
}
