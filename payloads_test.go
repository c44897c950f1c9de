package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/store"
)

// blob is a result of n bytes of JSON: a string that does not compress to nothing.
type blob struct {
	EffectID int64  `json:"effect_id"`
	Body     string `json:"body"`
}

func bigBody(n int, seed string) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s-%d;", seed, i*7919%100003)
	}
	return b.String()[:n]
}

// keyStorage says where a key's result is: inline (in idem_keys), or in the partition of
// idem_results for the day it names.
func keyStorage(t *testing.T, pool *pgxpool.Pool, schema string, key idem.Key) (inline bool, day *time.Time, partRows int) {
	t.Helper()
	ctx := context.Background()
	keys, results := "idem_keys", "idem_results"
	if schema != "" {
		keys, results = pgx.Identifier{schema, keys}.Sanitize(), pgx.Identifier{schema, results}.Sanitize()
	}
	require.NoError(t, pool.QueryRow(ctx, `SELECT result IS NOT NULL, result_day FROM `+keys+` WHERE scope = $1 AND id = $2`,
		key.Scope, key.ID).Scan(&inline, &day))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+results+` WHERE scope = $1 AND id = $2`,
		key.Scope, key.ID).Scan(&partRows))
	return inline, day, partRows
}

// TestLargeResults: a result over 1 KiB is stored in the partition of idem_results for the day
// its key expires on, and every reader gets it back byte for byte; a small one stays in the key's
// row; without a partition for its day a large one stays inline too.
func TestLargeResults(t *testing.T) {
	b := setup(t)
	ctx := b.ctx

	do := func(key idem.Key, size int, opts ...idem.Option) (blob, int) {
		ran := 0
		var out blob
		err := b.inTx(t, pgx.TxOptions{}, func(tx pgx.Tx) error {
			var err error
			out, err = idem.Do(ctx, tx, key, func(ctx context.Context, tx pgx.Tx) (blob, error) {
				ran++
				r := blob{Body: bigBody(size, key.ID)}
				err := tx.QueryRow(ctx, `INSERT INTO effects (key, note) VALUES ($1, 'x') RETURNING id`, key.ID).Scan(&r.EffectID)
				return r, err
			}, opts...)
			return err
		})
		require.NoError(t, err)
		return out, ran
	}

	for _, size := range []int{16, 1000, 4 << 10, 64 << 10, 1 << 20} {
		t.Run(fmt.Sprintf("%dB", size), func(t *testing.T) {
			key := idem.Key{Scope: "large", ID: fmt.Sprintf("k-%d", size)}
			first, ran := do(key, size)
			require.Equal(t, 1, ran)
			stored, err := json.Marshal(first)
			require.NoError(t, err)

			inline, day, rows := keyStorage(t, b.pool, "", key)
			if len(stored) > store.PayloadInlineMax {
				require.False(t, inline, "a result of %d bytes stays out of idem_keys", len(stored))
				require.NotNil(t, day)
				require.Equal(t, 1, rows)
				// The day its key expires on (TTL 24h), by the database's clock.
				var want time.Time
				require.NoError(t, b.pool.QueryRow(ctx, `SELECT (expires_at AT TIME ZONE 'UTC')::date FROM idem_keys WHERE scope = $1 AND id = $2`,
					key.Scope, key.ID).Scan(&want))
				require.Equal(t, want, *day)
			} else {
				require.True(t, inline)
				require.Nil(t, day)
				require.Zero(t, rows)
			}

			// Replays, in a transaction of the caller's and through Run, return the same bytes
			// and run nothing.
			for range 3 {
				again, ran := do(key, size)
				require.Zero(t, ran)
				require.Equal(t, first, again)
			}
			again, err := idem.Run(ctx, b.pool, key, func(context.Context, pgx.Tx) (blob, error) {
				t.Fatal("a replay ran fn")
				return blob{}, nil
			})
			require.NoError(t, err)
			require.Equal(t, first, again)
			require.Equal(t, 1, b.effects(t, key.ID))

			// The operator's views.
			raw, err := idem.KeyResult(ctx, b.pool, key)
			require.NoError(t, err)
			require.JSONEq(t, string(stored), string(raw))
			info, err := idem.KeyGet(ctx, b.pool, key)
			require.NoError(t, err)
			require.Equal(t, len(stored), info.ResultSize)
		})
	}

	t.Run("NoPartitionForTheDay", func(t *testing.T) {
		// A TTL past the days made ahead: the result stays inline, and replays.
		key := idem.Key{Scope: "large", ID: "far"}
		first, _ := do(key, 8<<10, idem.TTL(60*24*time.Hour))
		inline, day, rows := keyStorage(t, b.pool, "", key)
		require.True(t, inline)
		require.Nil(t, day)
		require.Zero(t, rows)
		again, ran := do(key, 8<<10, idem.TTL(60*24*time.Hour))
		require.Zero(t, ran)
		require.Equal(t, first, again)
	})

	t.Run("AnExpiredKeyReplaced", func(t *testing.T) {
		// Large, then expired and taken again with a small result, then again with a large one:
		// the key row always says where its current result is.
		key := idem.Key{Scope: "large", ID: "replaced"}
		do(key, 4<<10)
		expire := func() {
			_, err := b.pool.Exec(ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE scope = $1 AND id = $2`, key.Scope, key.ID)
			require.NoError(t, err)
		}
		expire()
		small, ran := do(key, 10)
		require.Equal(t, 1, ran)
		inline, day, _ := keyStorage(t, b.pool, "", key)
		require.True(t, inline)
		require.Nil(t, day)
		again, ran := do(key, 10)
		require.Zero(t, ran)
		require.Equal(t, small, again)

		expire()
		large, ran := do(key, 5<<10)
		require.Equal(t, 1, ran)
		inline, day, rows := keyStorage(t, b.pool, "", key)
		require.False(t, inline)
		require.NotNil(t, day)
		require.Equal(t, 2, rows, "the first large result's row stays, for its day's drop; the key reads its own")
		again, ran = do(key, 5<<10)
		require.Zero(t, ran)
		require.Equal(t, large, again)
		require.Equal(t, 3, b.effects(t, key.ID))
	})

	t.Run("ConcurrentDuplicates", func(t *testing.T) {
		// Sixteen callers of one key with a large result: one effect, and everyone who gets an
		// answer gets the same one.
		key := idem.Key{Scope: "large", ID: "concurrent"}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			answers []blob
		)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := idem.Run(ctx, b.pool, key, func(ctx context.Context, tx pgx.Tx) (blob, error) {
					r := blob{Body: bigBody(16<<10, "concurrent")}
					err := tx.QueryRow(ctx, `INSERT INTO effects (key, note) VALUES ($1, 'x') RETURNING id`, key.ID).Scan(&r.EffectID)
					return r, err
				}, idem.Wait(10*time.Second))
				if err != nil {
					return
				}
				mu.Lock()
				answers = append(answers, out)
				mu.Unlock()
			}()
		}
		wg.Wait()
		require.Equal(t, 1, b.effects(t, key.ID))
		require.NotEmpty(t, answers)
		for _, a := range answers {
			require.Equal(t, answers[0], a)
		}
		inline, _, rows := keyStorage(t, b.pool, "", key)
		require.False(t, inline)
		require.Equal(t, 1, rows)
	})
}

// TestLargeResultsInASchema: the partitions of a schema that needs quoting are found and made
// there, and results go to them.
func TestLargeResultsInASchema(t *testing.T) {
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	schema := `Tenant "7"`
	require.NoError(t, idem.Migrate(ctx, pool, idem.Schema(schema)))
	_, err := pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL)`)
	require.NoError(t, err)

	var parts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass`,
		pgx.Identifier{schema, "idem_results"}.Sanitize()).Scan(&parts))
	require.Equal(t, 16, parts, "Migrate makes yesterday's, today's and 14 days ahead")

	key := idem.Key{Scope: "s", ID: "big"}
	body := bigBody(3000, "schema")
	out, err := idem.Run(ctx, pool, key, func(context.Context, pgx.Tx) (string, error) { return body, nil }, idem.Schema(schema))
	require.NoError(t, err)
	require.Equal(t, body, out)
	inline, day, rows := keyStorage(t, pool, schema, key)
	require.False(t, inline)
	require.NotNil(t, day)
	require.Equal(t, 1, rows)
	again, err := idem.Run(ctx, pool, key, func(context.Context, pgx.Tx) (string, error) { return "", nil }, idem.Schema(schema))
	require.NoError(t, err)
	require.Equal(t, body, again)
}

// TestReapDropsResultPartitions: Reap drops a partition of idem_results whole once its day and
// one more have passed, keeps the others, makes the days ahead that are missing, and deletes the
// expired keys as before.
func TestReapDropsResultPartitions(t *testing.T) {
	b := setup(t)
	ctx := b.ctx
	st := store.For("")

	// Partitions of past days, made as the reaper makes them, each with an expired key whose
	// large result is there.
	var today time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today))
	past := []int{-5, -3, -2, -1}
	for _, d := range past {
		day := today.AddDate(0, 0, d)
		require.NoError(t, st.MakePartitions(ctx, b.pool, "idem_results", day, day))
		_, err := b.pool.Exec(ctx, `WITH r AS (INSERT INTO idem_results (day, scope, id, created_at, data)
	VALUES ($1::date, 'old', $2, $1::date::timestamp AT TIME ZONE 'UTC' - interval '1 day', $3))
INSERT INTO idem_keys (scope, id, result_day, created_at, expires_at) VALUES ('old', $2, $1, $1::date::timestamp AT TIME ZONE 'UTC' - interval '1 day', $1::date::timestamp AT TIME ZONE 'UTC' + interval '1 hour')`,
			day, fmt.Sprintf("d%d", d), []byte(`"`+bigBody(5000, "old")+`"`))
		require.NoError(t, err)
	}
	// A detached table left by a drop that did not finish.
	leftover := store.PartitionName("idem_results", today.AddDate(0, 0, -9))
	_, err := b.pool.Exec(ctx, `CREATE TABLE `+leftover+` (LIKE idem_results)`)
	require.NoError(t, err)
	// A day ahead that is missing.
	ahead := store.PartitionName("idem_results", today.AddDate(0, 0, 3))
	_, err = b.pool.Exec(ctx, `DROP TABLE `+ahead)
	require.NoError(t, err)

	exists := func(name string) bool {
		var ok bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok))
		return ok
	}
	n, err := idem.Reap(ctx, b.pool)
	require.NoError(t, err)
	require.EqualValues(t, len(past), n, "the expired keys go as before")

	for _, d := range past {
		name := store.PartitionName("idem_results", today.AddDate(0, 0, d))
		require.Equal(t, d <= -2, !exists(name), "%s: dropped once its day and one more have passed", name)
	}
	require.False(t, exists(leftover))
	require.True(t, exists(ahead), "Reap makes the missing days ahead")

	// The results of the dropped days are gone from the table; yesterday's stays until it can go.
	var left int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM idem_results WHERE scope = 'old'`).Scan(&left))
	require.Equal(t, 1, left)

	// Given a transaction instead of a pool, Reap leaves the drop for a Reap on a pool, which
	// can detach concurrently, and says so.
	old := today.AddDate(0, 0, -4)
	name := store.PartitionName("idem_results", old)
	require.NoError(t, st.MakePartitions(ctx, b.pool, "idem_results", old, old))
	var logs bytes.Buffer
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := idem.Reap(ctx, tx, idem.Logger(slog.New(slog.NewTextHandler(&logs, nil))))
		return err
	}))
	require.True(t, exists(name))
	require.Contains(t, logs.String(), "dropping them needs a *pgxpool.Pool")
	_, err = idem.Reap(ctx, b.pool)
	require.NoError(t, err)
	require.False(t, exists(name))

	// Two reapers at once: no error, each partition dropped once.
	require.NoError(t, st.MakePartitions(ctx, b.pool, "idem_results", today.AddDate(0, 0, -7), today.AddDate(0, 0, -6)))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = idem.Reap(ctx, b.pool)
		}()
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	for _, d := range []int{-6, -7} {
		require.False(t, exists(store.PartitionName("idem_results", today.AddDate(0, 0, d))))
	}
}

// TestMigrateDownKeepsLargeResults: reverting 010_results moves every large result back into
// its key's row before it drops idem_results.
func TestMigrateDownKeepsLargeResults(t *testing.T) {
	b := setup(t)
	ctx := b.ctx
	key := idem.Key{Scope: "down", ID: "big"}
	body := bigBody(6000, "down")
	_, err := idem.Run(ctx, b.pool, key, func(context.Context, pgx.Tx) (string, error) { return body, nil })
	require.NoError(t, err)
	inline, _, _ := keyStorage(t, b.pool, "", key)
	require.False(t, inline)

	require.NoError(t, idem.MigrateTo(ctx, b.pool, 9))
	// Reap on a schema before the payload tables has no partition to make or drop.
	_, err = idem.Reap(ctx, b.pool)
	require.NoError(t, err)
	var stored []byte
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT result FROM idem_keys WHERE scope = $1 AND id = $2`, key.Scope, key.ID).Scan(&stored))
	var got string
	require.NoError(t, json.Unmarshal(stored, &got))
	require.Equal(t, body, got)
	var left int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'idem\_results%'`).Scan(&left))
	require.Zero(t, left)

	// And up again: the result replays from its row, inline.
	require.NoError(t, idem.Migrate(ctx, b.pool))
	again, err := idem.Run(ctx, b.pool, key, func(context.Context, pgx.Tx) (string, error) { return "", nil })
	require.NoError(t, err)
	require.True(t, bytes.Equal([]byte(body), []byte(again)))
}

// TestReapWithoutCreatePrivilege: a reaper whose role may not create tables reaps keys as
// before, leaves the partitions for later with a warning, and does not fail; large results
// stay inline meanwhile.
func TestReapWithoutCreatePrivilege(t *testing.T) {
	b := setup(t)
	ctx := b.ctx
	// No partitions at all, as after applying schema.sql with another tool.
	_, err := b.pool.Exec(ctx, `DO $$ DECLARE n text; BEGIN
	FOR n IN SELECT relname FROM pg_class WHERE relname ~ '^idem_results_p[0-9]{8}$' LOOP EXECUTE 'DROP TABLE ' || quote_ident(n); END LOOP;
END $$;
CREATE ROLE idem_limited LOGIN;
GRANT USAGE ON SCHEMA public TO idem_limited;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO idem_limited;`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), `DROP OWNED BY idem_limited; DROP ROLE idem_limited`)
	})
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.User = "idem_limited"
	limited, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer limited.Close()

	key := idem.Key{Scope: "limited", ID: "big"}
	body := bigBody(4000, "limited")
	_, err = idem.Run(ctx, limited, key, func(context.Context, pgx.Tx) (string, error) { return body, nil })
	require.NoError(t, err)
	inline, day, _ := keyStorage(t, b.pool, "", key)
	require.True(t, inline, "no partition for its day: inline")
	require.Nil(t, day)
	_, err = b.pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, result, created_at, expires_at) VALUES ('limited', 'old', '1', now() - interval '2 days', now() - interval '1 day')`)
	require.NoError(t, err)

	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	n, err := idem.Reap(ctx, limited, idem.Logger(logger))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Contains(t, logs.String(), "payload partitions left for a later reap")
	require.Contains(t, logs.String(), "42501")

	again, err := idem.Run(ctx, limited, key, func(context.Context, pgx.Tx) (string, error) { return "", nil })
	require.NoError(t, err)
	require.Equal(t, body, again)
}
