package idemhttp_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// TestCredentialHeadersNotStored: response headers that carry credentials are not stored (so not
// in the database, not replayed to whoever sends the key later) unless configured; the first
// client still gets them.
func TestCredentialHeadersNotStored(t *testing.T) {
	t.Parallel()
	creds := map[string]string{"Authorization": "Bearer s3cret-a", "Proxy-Authorization": "Basic s3cret-b",
		"Authentication-Info": "nextnonce=s3cret-c", "Set-Cookie": "session=s3cret-d", "Cookie": "c=s3cret-e"}
	handler := func(b *testBundle) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for k, v := range creds {
				w.Header().Set(k, v)
			}
			b.create(w, r)
		})
	}
	t.Run("Default", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(handler(b))
		first := serve(h, request("POST", "/a", "k1", "x"))
		require.Equal(t, http.StatusCreated, first.Code)
		require.Equal(t, "Bearer s3cret-a", first.Header().Get("Authorization"), "the first client gets the response as written")
		replay := serve(h, request("POST", "/a", "k1", "x"))
		require.Equal(t, "true", replay.Header().Get("Idempotent-Replayed"))
		for k := range creds {
			require.Empty(t, replay.Header().Get(k), "%s replayed", k)
		}
		var stored string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT convert_from(result, 'UTF8') FROM idem_keys`).Scan(&stored))
		require.NotContains(t, stored, "s3cret", "a credential was stored")
	})
	t.Run("Configured", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{StoreCredentialHeaders: []string{"authorization"}})(handler(b))
		serve(h, request("POST", "/a", "k1", "x"))
		replay := serve(h, request("POST", "/a", "k1", "x"))
		require.Equal(t, "Bearer s3cret-a", replay.Header().Get("Authorization"))
		require.Empty(t, replay.Header().Get("Proxy-Authorization"))
	})
}

// TestStoredHeadersCountInTheCap: MaxResponseBytes bounds what is stored, headers included; a
// handler that sets megabytes of headers does not get them stored whole.
func TestStoredHeadersCountInTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.middleware(t, &idemhttp.Config{MaxResponseBytes: 1024})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("h", 2048))
		b.create(w, r)
	}))
	w := serve(h, request("POST", "/a", "k1", "x"))
	problem(t, w, http.StatusInternalServerError, "response-too-large")
	require.Zero(t, b.storedKeys(t))
	require.Zero(t, b.effects(t))
}
