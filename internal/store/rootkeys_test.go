package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// The statement added for idem.KeyList (the root package's others are in keytexts_test.go).

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
