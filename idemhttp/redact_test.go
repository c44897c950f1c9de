package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// TestRedact checks the hook for secrets shown once: the first client gets the whole response,
// the store and every replay get what the Redactor left, with the first status.
func TestRedact(t *testing.T) {
	t.Parallel()

	type apiKey struct {
		ID          int64  `json:"id"`
		Secret      string `json:"secret,omitempty"`
		SecretShown bool   `json:"secret_shown,omitempty"`
	}
	createKey := func(b *testBundle) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			b.runs.Add(1)
			t, _ := idemhttp.Tx(r.Context())
			var id int64
			if err := t.QueryRow(r.Context(), `INSERT INTO effects (note) VALUES ('key') RETURNING id`).Scan(&id); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Secret-Hint", "sk_live_")
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(apiKey{ID: id, Secret: "sk_live_0123456789"})
		}
	}
	redact := func(r *http.Request, resp *idemhttp.StoredResponse) {
		var k apiKey
		if json.Unmarshal(resp.Body, &k) == nil && k.Secret != "" {
			k.Secret, k.SecretShown = "", true
			resp.Body, _ = json.Marshal(k)
		}
		resp.Header.Del("X-Secret-Hint")
		resp.Status = http.StatusTeapot // ignored: a replay keeps the first status
	}

	for name, wrap := range map[string]func(b *testBundle) http.Handler{
		"Config": func(b *testBundle) http.Handler {
			return b.middleware(t, &idemhttp.Config{Redact: redact})(createKey(b))
		},
		"RouteConfig": func(b *testBundle) http.Handler {
			return b.middleware(t, nil)(idemhttp.Route(&idemhttp.RouteConfig{Redact: redact}, createKey(b)))
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			h := wrap(b)

			first := serve(h, request("POST", "/keys", "k1", ""))
			require.Equal(t, http.StatusCreated, first.Code)
			require.Contains(t, first.Body.String(), "sk_live_0123456789", "the first client gets the secret")
			require.Equal(t, "sk_live_", first.Header().Get("X-Secret-Hint"))

			replay := serve(h, request("POST", "/keys", "k1", ""))
			require.Equal(t, http.StatusCreated, replay.Code)
			require.Equal(t, "true", replay.Header().Get("Idempotent-Replayed"))
			require.JSONEq(t, `{"id":1,"secret_shown":true}`, replay.Body.String())
			require.Empty(t, replay.Header().Get("X-Secret-Hint"))
			require.Equal(t, "application/json", replay.Header().Get("Content-Type"))

			var stored []byte
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT result FROM idem_keys`).Scan(&stored))
			require.NotContains(t, string(stored), "sk_live", "the secret must not reach the database")
			require.EqualValues(t, 1, b.runs.Load())
			require.Equal(t, 1, b.effects(t))
		})
	}

	// Refusing to store is not the Redactor's to decide: committing the effects without the
	// response would let the retry run them again. Store returning false is the way, and it
	// rolls back the effects with the response.
	t.Run("RefusingRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{Store: func(status int) bool { return status != http.StatusCreated }})(createKey(b))
		for range 2 {
			w := serve(h, request("POST", "/keys", "k1", ""))
			require.Equal(t, http.StatusCreated, w.Code)
			require.Empty(t, w.Header().Get("Idempotent-Replayed"))
		}
		require.EqualValues(t, 2, b.runs.Load(), "nothing stored: each request runs")
		require.Zero(t, b.effects(t), "nothing stored: nothing committed")
		require.Zero(t, b.storedKeys(t))
	})
}
