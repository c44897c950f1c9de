package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// The statements added for idem.KeyList and for RunFork's events (the root package's others are
// in keytexts_test.go).

func TestKeyListStmt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Ids at the edges of printable ASCII, and of a prefix's range.
	for _, id := range []string{"!", "a", "a~", "ab", "a~~", "b", "~", "~~"} {
		b.insertDoKey(t, "s", id, time.Hour)
	}
	b.insertDoKey(t, "t", "a", time.Hour)
	b.insertRun(t, run{scope: "s", id: "ar"})
	list := func(p store.KeyListParams) []string {
		t.Helper()
		p.Scope = "s"
		if p.Limit == 0 {
			p.Limit = 100
		}
		keys, err := b.st.KeyList(b.ctx, b.pool, p)
		require.NoError(t, err)
		ids := []string{}
		for _, k := range keys {
			require.Equal(t, "s", k.Scope)
			ids = append(ids, k.ID)
		}
		return ids
	}
	require.Equal(t, []string{"!", "a", "ab", "ar", "a~", "a~~", "b", "~", "~~"}, list(store.KeyListParams{}), "byte order")
	require.Equal(t, []string{"a", "ab", "ar", "a~", "a~~"}, list(store.KeyListParams{Prefix: "a"}))
	require.Equal(t, []string{"a~", "a~~"}, list(store.KeyListParams{Prefix: "a~"}))
	require.Equal(t, []string{"~", "~~"}, list(store.KeyListParams{Prefix: "~"}))
	require.Equal(t, []string{"ar", "a~"}, list(store.KeyListParams{Prefix: "a", After: "ab", Limit: 2}))
	require.Equal(t, []string{"b", "~"}, list(store.KeyListParams{After: "a~~", Limit: 2}))
	require.Equal(t, []string{}, list(store.KeyListParams{Prefix: "a", After: "a~~"}))

	keys, err := b.st.KeyList(b.ctx, b.pool, store.KeyListParams{Scope: "s", Prefix: "ar", Limit: 1})
	require.NoError(t, err)
	require.Equal(t, store.RunRunning, *keys[0].RunState)
	got, _, err := b.st.KeyGet(b.ctx, b.pool, "s", "ar")
	require.NoError(t, err)
	require.Equal(t, got, keys[0], "a listed key reads as KeyGet reads it")
}

func TestRunForkEventsStmt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := &pgx.Batch{}
	for seq, s := range []struct{ kind, name, output string }{
		{"event", "status", `"a"`}, {"tx", "status", `"not an event"`}, {"event", "n", `1`}, {"event", "status", `"b"`}, {"event", "late", `true`},
	} {
		batch.Queue(`INSERT INTO idem_steps (scope, id, seq, name, kind, output) VALUES ('s', 'k', $1, $2, $3, $4)`, seq+1, s.name, s.kind, s.output)
	}
	batch.Queue(`INSERT INTO idem_steps (scope, id, seq, name, kind, error) VALUES ('s', 'k', 6, 'failed', 'event', 'boom')`)
	require.NoError(t, b.pool.SendBatch(b.ctx, batch).Close())
	events := func(id string) map[string]string {
		m := map[string]string{}
		rows, err := b.pool.Query(b.ctx, `SELECT name, convert_from(value, 'UTF8') FROM idem_events WHERE scope = 's' AND id = $1`, id)
		require.NoError(t, err)
		var name, value string
		_, err = pgx.ForEachRow(rows, []any{&name, &value}, func() error { m[name] = value; return nil })
		require.NoError(t, err)
		return m
	}
	for from, want := range map[int]map[string]string{
		1: {}, 2: {"status": `"a"`}, 4: {"status": `"a"`, "n": `1`}, 5: {"status": `"b"`, "n": `1`}, 7: {"status": `"b"`, "n": `1`, "late": `true`},
	} {
		id := "fork-" + string(rune('0'+from))
		require.NoError(t, b.st.RunForkEvents(b.ctx, b.pool, "s", "k", "s", id, from))
		require.Equal(t, want, events(id), "from step %d", from)
	}
}
