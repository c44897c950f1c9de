package idemhttp_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/internal/pgtemp"
)

// TestStoreFaults puts a Postgres-aware proxy between the middleware and the database.
func TestStoreFaults(t *testing.T) {
	t.Parallel()

	// faultySetup returns a bundle whose pool checks results directly, and a middleware whose
	// pool goes through the proxy.
	faultySetup := func(t *testing.T) (*testBundle, *faultproxy.Proxy, func(http.Handler) http.Handler) {
		dbURL := pgtemp.NewDB(t)
		proxied, proxy := faultproxy.NewPool(t, dbURL)
		direct, err := pgxpool.New(t.Context(), dbURL)
		require.NoError(t, err)
		t.Cleanup(direct.Close)
		require.NoError(t, idem.Migrate(t.Context(), direct))
		_, err = direct.Exec(t.Context(), `CREATE TABLE effects (id bigserial PRIMARY KEY, note text NOT NULL)`)
		require.NoError(t, err)

		mw, err := idemhttp.Middleware(proxied, &idemhttp.Config{Scope: userScope, MinBackoff: time.Microsecond, Logger: testLogger(t)})
		require.NoError(t, err)
		return &testBundle{ctx: t.Context(), pool: direct}, proxy, mw
	}

	t.Run("LostCommitReplyIsResolvedByReplay", func(t *testing.T) {
		t.Parallel()
		b, proxy, mw := faultySetup(t)
		h := mw(http.HandlerFunc(b.create))
		proxy.LoseNextCommitReply()
		// The COMMIT lands but its answer is lost. tx.Run runs the transaction again,
		// which finds the stored response: the client gets it, and the effect happened once.
		w := serve(h, request("POST", "/effects", "k1", ""))
		require.Equal(t, http.StatusCreated, w.Code)
		require.JSONEq(t, `{"id":1}`, w.Body.String())
		// It is marked replayed: the rerun read it from the store, as any retry would.
		require.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
		require.EqualValues(t, 1, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
		require.Equal(t, 1, proxy.Stats().LostCommitReplies)
	})

	t.Run("DroppedCommitRunsAgain", func(t *testing.T) {
		t.Parallel()
		b, proxy, mw := faultySetup(t)
		h := mw(http.HandlerFunc(b.create))
		proxy.DropNextCommit()
		w := serve(h, request("POST", "/effects", "k1", ""))
		require.Equal(t, http.StatusCreated, w.Code)
		require.Empty(t, w.Header().Get("Idempotent-Replayed"))
		require.EqualValues(t, 2, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
	})

	t.Run("ProxyGoneIs503", func(t *testing.T) {
		t.Parallel()
		b, proxy, mw := faultySetup(t)
		require.NoError(t, proxy.Close())
		h := mw(http.HandlerFunc(b.create))
		w := serve(h, request("POST", "/effects", "k1", ""))
		problem(t, w, http.StatusServiceUnavailable, "idempotency-store-unavailable")
		require.NotEmpty(t, w.Header().Get("Retry-After"))
		require.Zero(t, b.runs.Load())
	})
}
