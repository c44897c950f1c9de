package idem_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

// BenchmarkLargeResults measures what moving large results to day partitions costs Do: a fresh
// Do (in the caller's pgx.BeginFunc, one INSERT into a small table as its work) and a replay,
// with results of 16 B, 4 KiB and 64 KiB of hexadecimal digits (which Postgres cannot compress
// much), stored inline (every result in idem_keys, as before
// the payload tables: the threshold raised out of reach) and partitioned (the default). Each
// round runs every variant once, in an order shifted by one each round, with
// IDEM_BENCH_OPS operations (2,000 by default; a quarter of that at 64 KiB) shared by
// BENCH_CLIENTS' last count of clients (8); it logs operations per second and the ratio
// partitioned/inline of each pair. The 16 B pair runs the same statements either way: its
// spread is the noise of the run.
//
//	go test -run '^$' -bench '^BenchmarkLargeResults$' -benchtime 1x -count 1 .
func BenchmarkLargeResults(b *testing.B) {
	ctx := context.Background()
	clients := benchClients()[len(benchClients())-1]
	ops, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_OPS"))
	if ops <= 0 {
		ops = 2000
	}
	rounds := 3
	pool := transferPool(b, clients)
	_, err := pool.Exec(ctx, `CREATE TABLE work (id bigserial PRIMARY KEY, key text NOT NULL)`)
	require.NoError(b, err)

	type variant struct {
		size        int
		partitioned bool
		replay      bool
	}
	var variants []variant
	for _, size := range []int{16, 4 << 10, 64 << 10} {
		for _, replay := range []bool{false, true} {
			for _, p := range []bool{false, true} {
				variants = append(variants, variant{size, p, replay})
			}
		}
	}
	name := func(v variant) string {
		s := "inline"
		if v.partitioned {
			s = "partitioned"
		}
		op := "fresh"
		if v.replay {
			op = "replay"
		}
		return fmt.Sprintf("%dB/%s/%s", v.size, op, s)
	}
	bodies := map[int]string{}
	for _, v := range variants {
		bodies[v.size] = randomHex(v.size)
	}
	fresh := func(size int) func(ctx context.Context, key idem.Key) error {
		return func(ctx context.Context, key idem.Key) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := idem.Do(ctx, tx, key, func(ctx context.Context, tx pgx.Tx) (blob, error) {
					r := blob{Body: bodies[size]}
					return r, tx.QueryRow(ctx, `INSERT INTO work (key) VALUES ($1) RETURNING id`, key.ID).Scan(&r.EffectID)
				})
				return err
			})
		}
	}
	// Keys to replay, stored once per variant with that variant's threshold.
	replayKeys := map[string][]idem.Key{}
	for _, v := range variants {
		if !v.replay {
			continue
		}
		restore := func() {}
		if !v.partitioned {
			restore = store.SetPayloadInlineMax(1 << 30)
		}
		keys := make([]idem.Key, 500)
		for i := range keys {
			keys[i] = idem.Key{Scope: "bench", ID: uuid.Must(uuid.NewV7()).String()}
			require.NoError(b, fresh(v.size)(ctx, keys[i]))
		}
		restore()
		replayKeys[name(v)] = keys
	}

	tps := map[string][]float64{}
	for round := range rounds {
		order := append(variants[round%len(variants):], variants[:round%len(variants)]...)
		for _, v := range order {
			restore := func() {}
			if !v.partitioned {
				restore = store.SetPayloadInlineMax(1 << 30)
			}
			op := fresh(v.size)
			keys := replayKeys[name(v)]
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			n := ops
			if v.size > 16<<10 {
				n = max(ops/4, 1) // each costs several times more
			}
			start := time.Now()
			for range clients {
				wg.Go(func() {
					for {
						i := next.Add(1) - 1
						if i >= int64(n) {
							return
						}
						key := idem.Key{Scope: "bench", ID: uuid.Must(uuid.NewV7()).String()}
						if v.replay {
							key = keys[int(i)%len(keys)]
						}
						if err := op(ctx, key); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			took := time.Since(start)
			restore()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			tps[name(v)] = append(tps[name(v)], float64(n)/took.Seconds())
		}
	}
	for _, v := range variants {
		if !v.partitioned {
			continue
		}
		inline := v
		inline.partitioned = false
		p, in := tps[name(v)], tps[name(inline)]
		line := fmt.Sprintf("%-28s", name(v))
		for r := range rounds {
			line += fmt.Sprintf("  %7.0f/%7.0f op/s = %.2f", p[r], in[r], p[r]/in[r])
		}
		b.Log(line)
	}
}

// BenchmarkPayloadWeek compares deleting against dropping over a simulated week of Do's keys:
// seven days of IDEM_BENCH_WEEK_KEYS keys a day (20,000 by default) with TTLs of one to seven
// days, three in ten of them with a 4 KiB result (the rest 200 B), written with the creation
// times of the seven days before now, as Do would have written them (in the partition of their
// expiry day, or inline when everything is inline, as before the payload tables). Then one Reap,
// which finds every key whose expiry has passed. It logs, for each layout: keys and partitions
// reaped, the reaper's time and rows per second (at ReapBusy 1, so that it never rests), the
// WAL it wrote, and the size of idem_keys and idem_results (heap, TOAST and indexes) before and
// after, and the time and WAL of the VACUUM that the deletes leave to do, and the size after it.
//
//	go test -run '^$' -bench '^BenchmarkPayloadWeek$' -benchtime 1x .
func BenchmarkPayloadWeek(b *testing.B) {
	benchWeek(b, week{
		what: "keys", perDay: 1, family: "idem_results", partsFrom: -8, partsTo: -2,
		tables: []string{"idem_keys"}, vacuum: []string{"idem_keys", "idem_results"},
		due: func(table func(string) string) string {
			return `SELECT count(*) FROM ` + table("idem_keys") + ` WHERE expires_at <= now()`
		},
		reaped: func(rep idem.ReapReport) int64 { return rep.Keys },
		write: func(table func(string) string, partitioned bool) string {
			sql := `WITH k AS (
	SELECT 'week' AS scope, gen_random_uuid()::text AS id, i % 10 < 3 AS large,
		now() - $1::int * interval '1 day' + (i::float8 / $2) * interval '1 day' AS created_at,
		(1 + i % 7) * interval '1 day' AS ttl
	FROM generate_series(0, $2 - 1) i
), v AS (
	SELECT scope, id, created_at, created_at + ttl AS expires_at,
		convert_to(CASE WHEN large THEN (SELECT string_agg(md5(random()::text || k.id || g), '') FROM generate_series(1, 128) g)
			ELSE repeat(md5(id), 6) END, 'UTF8') AS result, large
	FROM k
)`
			if partitioned {
				return sql + `, r AS (
	INSERT INTO ` + table("idem_results") + ` (day, scope, id, created_at, data)
	SELECT (expires_at AT TIME ZONE 'UTC')::date, scope, id, created_at, result FROM v WHERE large
)
INSERT INTO ` + table("idem_keys") + ` (scope, id, result, result_day, created_at, expires_at)
SELECT scope, id, CASE WHEN large THEN NULL ELSE result END, CASE WHEN large THEN (expires_at AT TIME ZONE 'UTC')::date END,
	created_at, expires_at FROM v`
			}
			return sql + `
INSERT INTO ` + table("idem_keys") + ` (scope, id, result, created_at, expires_at) SELECT scope, id, result, created_at, expires_at FROM v`
		},
	})
}

// BenchmarkOutboxWeek is BenchmarkPayloadWeek for the outbox: seven days of
// IDEM_BENCH_WEEK_KEYS messages a day, three in ten with a 4 KiB body and the rest 200 B, each
// published a second after its Append, written with the times of the seven days before now
// (bodies over 1 KiB in the partition of their Append's day, or inline when everything is inline,
// as before the payload tables). Then one Reap at the default retention of a day, which deletes
// the messages published before it and drops the six days' partitions that nothing points into.
// It logs what BenchmarkPayloadWeek logs, for idem_outbox and idem_outbox_payloads.
//
//	go test -run '^$' -bench '^BenchmarkOutboxWeek$' -benchtime 1x .
func BenchmarkOutboxWeek(b *testing.B) {
	benchWeek(b, week{
		what: "messages", perDay: 1, family: "idem_outbox_payloads", partsFrom: -7, partsTo: -1, dropped: 6,
		tables: []string{"idem_outbox"}, vacuum: []string{"idem_outbox"},
		due: func(table func(string) string) string {
			return `SELECT count(*) FROM ` + table("idem_outbox") + ` WHERE published_at < now() - interval '1 day'`
		},
		reaped: func(rep idem.ReapReport) int64 { return rep.Outbox },
		write: func(table func(string) string, partitioned bool) string {
			// Messages appended over day $1 before now, with UUIDv7 ids of their time.
			sql := `WITH m AS (
	SELECT i % 10 < 3 AS large, 'k' || (i % 1000) AS key,
		now() - $1::int * interval '1 day' + (i::float8 / $2) * interval '1 day' AS created_at
	FROM generate_series(0, $2 - 1) i
), v AS (
	SELECT (lpad(to_hex((extract(epoch FROM created_at) * 1000)::int8), 12, '0') || '7' ||
			substr(md5(random()::text), 1, 19))::uuid AS id, key, created_at, large,
		convert_to(CASE WHEN large THEN (SELECT string_agg(md5(random()::text || m.key || g), '') FROM generate_series(1, 128) g)
			ELSE repeat(md5(key), 6) END, 'UTF8') AS payload
	FROM m
)`
			if partitioned {
				return sql + `, p AS (
	INSERT INTO ` + table("idem_outbox_payloads") + ` (day, id, data)
	SELECT (created_at AT TIME ZONE 'UTC')::date, id, payload FROM v WHERE large
)
INSERT INTO ` + table("idem_outbox") + ` (id, topic, key, hash, payload, payload_day, created_at, published_at)
SELECT id, 'orders', key, 0, CASE WHEN large THEN NULL ELSE payload END,
	CASE WHEN large THEN (created_at AT TIME ZONE 'UTC')::date END, created_at, created_at + interval '1 second' FROM v`
			}
			return sql + `
INSERT INTO ` + table("idem_outbox") + ` (id, topic, key, hash, payload, created_at, published_at)
SELECT id, 'orders', key, 0, payload, created_at, created_at + interval '1 second' FROM v`
		},
	})
}

// BenchmarkRunWeek is BenchmarkPayloadWeek for workflow runs: seven days of a quarter of
// IDEM_BENCH_WEEK_KEYS finished runs a day (5,000 by default), each with its key and three steps,
// the second step's output 4 KiB in three runs in ten and every other output 200 B, kept for the
// engine's default TTL (a day; the TTL is the engine's, the same for every run) after they finish,
// a minute after their start. They are written with the times of the seven days before now
// (large outputs in the partition of their run's start day, or inline when everything is inline,
// as before the payload tables). Then one Reap, which deletes the runs expired by then with their
// steps and keys, and drops the six days' partitions where no run started is left. It logs what
// BenchmarkPayloadWeek logs, for idem_runs, idem_steps, idem_keys and idem_run_payloads.
//
//	go test -run '^$' -bench '^BenchmarkRunWeek$' -benchtime 1x .
func BenchmarkRunWeek(b *testing.B) {
	benchWeek(b, week{
		what: "runs", perDay: 0.25, family: "idem_run_payloads", partsFrom: -7, partsTo: -1, dropped: 6,
		tables: []string{"idem_runs", "idem_steps", "idem_keys"}, vacuum: []string{"idem_runs", "idem_steps", "idem_keys"},
		due: func(table func(string) string) string {
			return `SELECT count(*) FROM ` + table("idem_runs") + ` WHERE expires_at <= now()`
		},
		reaped: func(rep idem.ReapReport) int64 { return rep.Runs },
		write: func(table func(string) string, partitioned bool) string {
			sql := `WITH r AS (
	SELECT 'week' AS scope, gen_random_uuid()::text AS id, i % 10 < 3 AS large,
		now() - $1::int * interval '1 day' + (i::float8 / $2) * interval '1 day' AS created_at
	FROM generate_series(0, $2 - 1) i
), k AS (
	INSERT INTO ` + table("idem_keys") + ` (scope, id, workflow, created_at, expires_at)
	SELECT scope, id, 'week', created_at, 'infinity' FROM r
), runs AS (
	INSERT INTO ` + table("idem_runs") + ` (scope, id, workflow, state, input, output, created_at, updated_at, finished_at, expires_at)
	SELECT scope, id, 'week', 'done', convert_to('{"order":"' || id || '"}', 'UTF8'), convert_to('"ok"', 'UTF8'), created_at,
		created_at + interval '1 minute', created_at + interval '1 minute',
		created_at + interval '1 minute' + ` + strconv.FormatInt(idem.DefaultTTL.Microseconds(), 10) + ` * interval '1 microsecond' FROM r
), s AS (
	SELECT r.scope, r.id, r.created_at, g AS seq, r.large AND g = 2 AS big,
		convert_to(CASE WHEN r.large AND g = 2 THEN (SELECT string_agg(md5(random()::text || r.id || x), '') FROM generate_series(1, 128) x)
			ELSE repeat(md5(r.id || g), 6) END, 'UTF8') AS output
	FROM r, generate_series(1, 3) g
)`
			if partitioned {
				return sql + `, p AS (
	INSERT INTO ` + table("idem_run_payloads") + ` (day, scope, id, kind, ref, data)
	SELECT (created_at AT TIME ZONE 'UTC')::date, scope, id, 's', seq::text, output FROM s WHERE big
)
INSERT INTO ` + table("idem_steps") + ` (scope, id, seq, name, kind, output, output_day, created_at)
SELECT scope, id, seq, 'step' || seq, 'tx', CASE WHEN big THEN NULL ELSE output END,
	CASE WHEN big THEN (created_at AT TIME ZONE 'UTC')::date END, created_at + seq * interval '1 second' FROM s`
			}
			return sql + `
INSERT INTO ` + table("idem_steps") + ` (scope, id, seq, name, kind, output, created_at)
SELECT scope, id, seq, 'step' || seq, 'tx', output, created_at + seq * interval '1 second' FROM s`
		},
	})
}

// week is one payload family's simulated week, for benchWeek.
type week struct {
	what      string  // what a row reaped is, for the log
	perDay    float64 // rows a day, as a share of IDEM_BENCH_WEEK_KEYS
	family    string  // the payload table
	partsFrom int     // its partitions made for the week, in days from today
	partsTo   int
	dropped   int                                    // partitions the Reap must drop (0: not checked)
	tables    []string                               // the owner tables, sized with the family's partitions
	vacuum    []string                               // the tables vacuumed after the Reap
	due       func(table func(string) string) string // counts the rows due, in tables named by table
	reaped    func(idem.ReapReport) int64
	// write returns the statement that writes day $1 before now's $2 rows, in tables named by
	// table, in the family's partitions or inline.
	write func(table func(string) string, partitioned bool) string
}

// benchWeek runs w's week three times in each layout, interleaved, each in a schema of its own:
// write the seven days, CHECKPOINT, then one Reap at ReapBusy 1 (so that it never rests), then
// VACUUM, logging time, rows per second, WAL and disk of each.
func benchWeek(b *testing.B, w week) {
	ctx := context.Background()
	perDay, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_WEEK_KEYS"))
	if perDay <= 0 {
		perDay = 20_000
	}
	perDay = max(int(float64(perDay)*w.perDay), 1)
	pool := transferPool(b, 4)
	var today time.Time
	require.NoError(b, pool.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today))

	for round, partitioned := range []bool{false, true, true, false, false, true} {
		schema := fmt.Sprintf("week_%s_%d", w.what, round)
		require.NoError(b, idem.Migrate(ctx, pool, idem.Schema(schema)))
		table := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
		if partitioned {
			// The days of the week behind: the reaper made them as the week went.
			require.NoError(b, store.For(schema).MakePartitions(ctx, pool, w.family, today.AddDate(0, 0, w.partsFrom), today.AddDate(0, 0, w.partsTo)))
		}
		size := func() int64 {
			return tablesSize(b, pool, schema, strings.ReplaceAll(w.family, "_", `\_`)+`\_p%`, w.tables...)
		}
		walBefore := walLSN(b, pool)
		writeStart := time.Now()
		sql := w.write(table, partitioned)
		for d := 7; d >= 1; d-- {
			_, err := pool.Exec(ctx, sql, d, perDay)
			require.NoError(b, err)
		}
		writeTook, writeWAL := time.Since(writeStart), walLSN(b, pool)-walBefore
		_, err := pool.Exec(ctx, `CHECKPOINT`) // every layout starts its reaping after a checkpoint
		require.NoError(b, err)
		before := size()

		var due int64
		require.NoError(b, pool.QueryRow(ctx, w.due(table)).Scan(&due))
		walBefore = walLSN(b, pool)
		start := time.Now()
		rep, err := idem.ReapWithReport(ctx, pool, idem.Schema(schema), idem.ReapBusy(1))
		took := time.Since(start)
		require.NoError(b, err)
		n := w.reaped(rep)
		require.GreaterOrEqual(b, n, due) // and those that came due meanwhile
		if partitioned && w.dropped > 0 {
			require.Len(b, rep.PartitionsDropped, w.dropped)
		}
		reapWAL := walLSN(b, pool) - walBefore
		after := size()
		walBefore = walLSN(b, pool)
		vacuumStart := time.Now()
		for _, name := range w.vacuum {
			_, err = pool.Exec(ctx, `VACUUM `+table(name))
			require.NoError(b, err)
		}
		vacuumTook, vacuumWAL := time.Since(vacuumStart), walLSN(b, pool)-walBefore
		vacuumed := size()
		var parts int
		require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass`, table(w.family)).Scan(&parts))

		layout := "inline"
		if partitioned {
			layout = "partitioned"
		}
		b.Logf("%-11s write %d %s: %.1f s, WAL %.1f MB | reap %d: %.2f s, %.0f %s/s, WAL %.1f MB, %d partitions dropped | VACUUM %.2f s, WAL %.1f MB | size %.1f MB -> %.1f MB, after VACUUM %.1f MB | partitions left %d",
			layout, 7*perDay, w.what, writeTook.Seconds(), float64(writeWAL)/1e6, n, took.Seconds(), float64(n)/took.Seconds(), w.what,
			float64(reapWAL)/1e6, len(rep.PartitionsDropped), vacuumTook.Seconds(), float64(vacuumWAL)/1e6, float64(before)/1e6,
			float64(after)/1e6, float64(vacuumed)/1e6, parts)
		_, err = pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		require.NoError(b, err)
	}
}

// randomHex is n bytes of hexadecimal digits that do not repeat: a payload Postgres cannot
// compress much, as a response full of identifiers and signatures is.
func randomHex(n int) string {
	var b strings.Builder
	sum := sha256.Sum256([]byte("idem"))
	for b.Len() < n {
		b.WriteString(hex.EncodeToString(sum[:]))
		sum = sha256.Sum256(sum[:])
	}
	return b.String()[:n]
}

func walLSN(b *testing.B, pool *pgxpool.Pool) int64 {
	var lsn int64
	require.NoError(b, pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&lsn))
	return lsn
}

// tablesSize is the disk taken by the tables named tables and every table whose name is LIKE
// parts in schema, with their TOAST and indexes.
func tablesSize(b *testing.B, pool *pgxpool.Pool, schema, parts string, tables ...string) int64 {
	var n int64
	require.NoError(b, pool.QueryRow(context.Background(), `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::int8
FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
WHERE s.nspname = $1 AND c.relkind = 'r' AND (c.relname = ANY($2) OR c.relname LIKE $3)`, schema, tables, parts).Scan(&n))
	return n
}
