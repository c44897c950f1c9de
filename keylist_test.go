package idem_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestKeyList(t *testing.T) {
	t.Parallel()

	// seed stores n keys of Do's in scope, named prefix-000 on, and returns their ids.
	seed := func(t *testing.T, b *testBundle, scope, prefix string, n int) []string {
		t.Helper()
		ids := make([]string, n)
		for i := range n {
			ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
			_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: scope, ID: ids[i], Fingerprint: idem.Fingerprint(ids[i])},
				recordEffect(ids[i], "n", nil))
			require.NoError(t, err)
		}
		return ids
	}
	// all pages through a listing and returns the ids in order, and how many pages it took.
	all := func(t *testing.T, b *testBundle, p idem.KeyListParams) ([]string, int) {
		t.Helper()
		var ids []string
		pages := 0
		for {
			res, err := idem.KeyList(b.ctx, b.pool, &p)
			require.NoError(t, err)
			pages++
			for _, k := range res.Keys {
				require.Equal(t, p.Scope, k.Scope)
				ids = append(ids, k.ID)
			}
			if res.Next == "" {
				return ids, pages
			}
			p.After = res.Next
		}
	}

	t.Run("PagesInIDOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := append(seed(t, b, "tenant-a", "order", 7), seed(t, b, "tenant-a", "refund", 3)...)
		seed(t, b, "tenant-b", "order", 4)
		got, pages := all(t, b, idem.KeyListParams{Scope: "tenant-a", Limit: 3})
		require.Equal(t, ids, got, "every key of the scope once, in id order, and no other scope's")
		require.Equal(t, 4, pages, "10 keys in pages of 3; a full last page would need one more read")

		got, _ = all(t, b, idem.KeyListParams{Scope: "tenant-a", Prefix: "refund", Limit: 2})
		require.Equal(t, ids[7:], got)
		got, _ = all(t, b, idem.KeyListParams{Scope: "tenant-a", Prefix: "order-00"})
		require.Equal(t, ids[:7], got)
		got, _ = all(t, b, idem.KeyListParams{Scope: "tenant-a", Prefix: "x"})
		require.Empty(t, got)
	})

	t.Run("KeysAsKeyGetReadsThem", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b, "s", "do", 2)
		_, err := b.pool.Exec(b.ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE id = 'do-001'`)
		require.NoError(t, err)
		b.seedRun(t, "s", "run-1", "payout", "failed", "now() + interval '1 hour'")
		res, err := idem.KeyList(b.ctx, b.pool, &idem.KeyListParams{Scope: "s"})
		require.NoError(t, err)
		require.Len(t, res.Keys, 3)
		require.Empty(t, res.Next)
		for _, k := range res.Keys {
			info, err := idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: k.Scope, ID: k.ID})
			require.NoError(t, err)
			require.Equal(t, info, k)
		}
		require.False(t, res.Keys[0].Expired)
		require.True(t, res.Keys[1].Expired, "an expired key is listed until the reaper deletes it")
		require.Equal(t, "payout", res.Keys[2].Workflow)
		require.Equal(t, "failed", res.Keys[2].RunState)
	})

	t.Run("CursorStableUnderInserts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := seed(t, b, "s", "k", 6)
		res, err := idem.KeyList(b.ctx, b.pool, &idem.KeyListParams{Scope: "s", Limit: 3})
		require.NoError(t, err)
		// Keys added before and after the cursor's position: the next page goes on from it.
		seed(t, b, "s", "a", 2)
		seed(t, b, "s", "z", 1)
		got, _ := all(t, b, idem.KeyListParams{Scope: "s", Limit: 3, After: res.Next})
		require.Equal(t, append(ids[3:], "z-000"), got)
	})

	t.Run("BadParamsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b, "s", "k", 3)
		res, err := idem.KeyList(b.ctx, b.pool, &idem.KeyListParams{Scope: "s", Limit: 1})
		require.NoError(t, err)
		require.NotEmpty(t, res.Next)
		forge := func(json string) string { return base64.RawURLEncoding.EncodeToString([]byte(json)) }
		for _, after := range []string{
			"garbage!", forge(`{"s":"s","i":"a b"}`), forge(`{"s":"s","i":""}`), forge(`{"s":"s\u0000","i":"k"}`),
			forge(`{"s":"s","i":"` + strings.Repeat("x", 300) + `"}`), forge(`[1,2]`), forge(`{"s":"other","i":"k-000"}`),
		} {
			_, err := idem.KeyList(b.ctx, b.pool, &idem.KeyListParams{Scope: "s", After: after})
			require.ErrorIs(t, err, idem.ErrInvalidCursor, "cursor %q", after)
		}
		_, err = idem.KeyList(b.ctx, b.pool, &idem.KeyListParams{Scope: "other", After: res.Next})
		require.ErrorIs(t, err, idem.ErrInvalidCursor, "a cursor of another scope's listing")

		for _, c := range []struct {
			p    idem.KeyListParams
			want string
		}{
			{idem.KeyListParams{}, "KeyListParams.Scope cannot be empty"},
			{idem.KeyListParams{Scope: "a\x1bb"}, "KeyListParams.Scope is not a scope"},
			{idem.KeyListParams{Scope: "s", Prefix: "a b"}, "KeyListParams.Prefix cannot start a key's ID"},
			{idem.KeyListParams{Scope: "s", Prefix: "é"}, "KeyListParams.Prefix cannot start a key's ID"},
			{idem.KeyListParams{Scope: "s", Limit: -1}, "KeyListParams.Limit cannot be negative"},
			{idem.KeyListParams{Scope: "s", Limit: idem.MaxKeyListLimit + 1}, "KeyListParams.Limit cannot be more than 1000"},
		} {
			_, err := idem.KeyList(b.ctx, b.pool, &c.p)
			require.ErrorContains(t, err, c.want, "%+v", c.p)
		}
		_, err = idem.KeyList(context.Background(), nil, &idem.KeyListParams{Scope: "s"})
		require.ErrorContains(t, err, "db is nil")
	})

	t.Run("MissingTables", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := idem.KeyList(b.ctx, b.pool, &idem.KeyListParams{Scope: "s"}, idem.Schema("nowhere"))
		require.ErrorContains(t, err, "run idem.Migrate")
	})

	t.Run("Expiry", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b, "s", "k", 1)
		res, err := idem.KeyList(b.ctx, b.pool, &idem.KeyListParams{Scope: "s"})
		require.NoError(t, err)
		require.NotNil(t, res.Keys[0].Expires)
		require.InDelta(t, idem.DefaultTTL.Seconds(), res.Keys[0].Expires.Sub(res.Keys[0].Created).Seconds(), 1)
		require.WithinDuration(t, time.Now(), res.Keys[0].Created, time.Minute)
	})
}
