package idemhttp_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

func TestRoute(t *testing.T) {
	t.Parallel()

	required := &idemhttp.RouteConfig{Key: idemhttp.KeyRequired}

	t.Run("WrappedDirectly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mw := b.middleware(t, nil)
		h := mw(idemhttp.Route(required, http.HandlerFunc(b.create)))
		problem(t, serve(h, request("POST", "/x", "", "")), http.StatusBadRequest, "idempotency-key-missing")
		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/x", "k1", "")).Code)
	})

	t.Run("OptionalOverridesRequireKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mw := b.middleware(t, &idemhttp.Config{RequireKey: true})
		h := mw(idemhttp.Route(&idemhttp.RouteConfig{Key: idemhttp.KeyOptional}, http.HandlerFunc(b.create)))
		require.Equal(t, http.StatusTeapot, serve(h, request("POST", "/x", "", "")).Code)
	})

	t.Run("FromConfigRouteBehindARouter", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mux := http.NewServeMux()
		mux.Handle("POST /required", idemhttp.Route(required, http.HandlerFunc(b.create)))
		mux.HandleFunc("POST /optional", b.create)
		mw := b.middleware(t, &idemhttp.Config{Route: func(r *http.Request) *idemhttp.RouteConfig {
			if r.URL.Path == "/required" {
				return required
			}
			return nil
		}})
		h := mw(mux)
		problem(t, serve(h, request("POST", "/required", "", "")), http.StatusBadRequest, "idempotency-key-missing")
		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/required", "k1", "")).Code)
		require.Equal(t, http.StatusTeapot, serve(h, request("POST", "/optional", "", "")).Code)
	})

	t.Run("NotAppliedIs500", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mux := http.NewServeMux()
		mux.Handle("POST /required", idemhttp.Route(required, http.HandlerFunc(b.create)))
		h := b.middleware(t, &idemhttp.Config{Logger: testLogger(t)})(mux)
		// Without the check, the route's required key would silently be optional.
		problem(t, serve(h, request("POST", "/required", "", "")), http.StatusInternalServerError, "idempotency-misconfigured")
		problem(t, serve(h, request("POST", "/required", "k1", "")), http.StatusInternalServerError, "idempotency-misconfigured")
		require.Zero(t, b.runs.Load())
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("OwnFingerprintAndStore", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rc := &idemhttp.RouteConfig{
			// Only the body counts: the query is a tracking parameter.
			Fingerprint: func(r *http.Request, body []byte) []byte { return idem.Fingerprint(body) },
			Store:       func(status int) bool { return status < 400 },
		}
		fail := true
		h := b.middleware(t, nil)(idemhttp.Route(rc, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if fail {
				http.Error(w, "try later", http.StatusConflict)
				return
			}
			b.create(w, r)
		})))
		require.Equal(t, http.StatusConflict, serve(h, request("POST", "/x?utm=1", "k1", "same")).Code)
		fail = false
		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/x?utm=2", "k1", "same")).Code)
		w := serve(h, request("POST", "/x?utm=3", "k1", "same"))
		require.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
		problem(t, serve(h, request("POST", "/x", "k1", "other")), http.StatusUnprocessableEntity, "idempotency-key-reused")
	})
}

// TestOutbox shows the transaction from Tx is the one the response is stored in: what the
// handler writes through it commits with the stored response, or not at all.
func TestOutbox(t *testing.T) {
	t.Parallel()

	t.Run("CommitsWithStoredResponse", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(b.ctx, `CREATE TABLE outbox (payload text NOT NULL)`)
		require.NoError(t, err)
		var seenKeyInTx int
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dbtx, ok := idemhttp.Tx(r.Context())
			require.True(t, ok)
			body, _ := io.ReadAll(r.Body)
			_, err := dbtx.Exec(r.Context(), `INSERT INTO outbox VALUES ($1)`, string(body))
			require.NoError(t, err)
			// Before the commit, nobody else sees the job or the key.
			var n int
			require.NoError(t, b.pool.QueryRow(r.Context(), `SELECT count(*) FROM outbox`).Scan(&n))
			seenKeyInTx = n + b.storedKeys(t)
			w.WriteHeader(http.StatusAccepted)
		}))
		require.Equal(t, http.StatusAccepted, serve(h, request("POST", "/jobs", "k1", "job-1")).Code)
		require.Zero(t, seenKeyInTx)
		var payload string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT payload FROM outbox`).Scan(&payload))
		require.Equal(t, "job-1", payload)
		require.Equal(t, 1, b.storedKeys(t))
	})

	t.Run("RollsBackWithUnstoredResponse", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dbtx, _ := idemhttp.Tx(r.Context())
			_, err := dbtx.Exec(r.Context(), `INSERT INTO effects (note) VALUES ('job')`)
			require.NoError(t, err)
			w.WriteHeader(http.StatusInternalServerError)
		}))
		require.Equal(t, http.StatusInternalServerError, serve(h, request("POST", "/jobs", "k1", "")).Code)
		require.Zero(t, b.effects(t))
		require.Zero(t, b.storedKeys(t))
	})
}

// TestKey checks that a handler sees the key the middleware used, without parsing the header.
func TestKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		got idem.Key
		ok  bool
	)
	h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok = idemhttp.Key(r.Context())
		w.WriteHeader(http.StatusNoContent)
	}))

	r := request("POST", "/x?y=1", "", `{"a":1}`)
	r.Header.Set("Idempotency-Key", `"k-\"1\""`) // quoted, with escapes: the ID is unquoted
	require.Equal(t, http.StatusNoContent, serve(h, r).Code)
	require.True(t, ok)
	require.Equal(t, "alice", got.Scope)
	require.Equal(t, `k-"1"`, got.ID)
	require.Equal(t, idemhttp.DefaultFingerprint(r, []byte(`{"a":1}`)), got.Fingerprint)
	var stored int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_keys WHERE scope = $1 AND id = $2`, got.Scope, got.ID).Scan(&stored))
	require.Equal(t, 1, stored, "the key the handler sees is the one stored")

	// No key, or a method the middleware does not guard: no key, as Tx has no transaction.
	for _, r := range []*http.Request{request("POST", "/x", "", ""), request("GET", "/x", "k2", "")} {
		got, ok = idem.Key{ID: "stale"}, true
		serve(h, r)
		require.False(t, ok)
		require.Zero(t, got)
	}
	_, ok = idemhttp.Key(t.Context())
	require.False(t, ok)
}
