package idemhttp_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// TestConfigValidation checks that Middleware refuses a bad setting when it is called, with an
// error naming the field, instead of answering every request with a 503.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	scope := func(*http.Request) string { return "s" }
	for _, tt := range []struct {
		cfg  idemhttp.Config
		want string
	}{
		{idemhttp.Config{}, "Scope cannot be nil"},
		{idemhttp.Config{Scope: scope, Methods: []string{"post"}}, "Methods must be upper-case"},
		{idemhttp.Config{Scope: scope, MismatchStatus: 409}, "MismatchStatus must be 422 or 400"},
		{idemhttp.Config{Scope: scope, MaxBodyBytes: -1}, "MaxBodyBytes cannot be negative"},
		{idemhttp.Config{Scope: scope, TTL: time.Millisecond}, "TTL cannot be less than one second"},
		{idemhttp.Config{Scope: scope, Wait: -time.Second}, "Wait cannot be negative"},
		{idemhttp.Config{Scope: scope, InFlightRetryAfter: 10 * time.Millisecond}, "InFlightRetryAfter cannot be less than one second"},
		{idemhttp.Config{Scope: scope, Schema: strings.Repeat("s", 64)}, "Schema cannot be longer than 63 bytes"},
		{idemhttp.Config{Scope: scope, Isolation: "snapshot"}, "Isolation must be one of"},
		{idemhttp.Config{Scope: scope, MaxAttempts: -1}, "MaxAttempts cannot be negative"},
		{idemhttp.Config{Scope: scope, MinBackoff: -time.Second}, "MinBackoff cannot be negative"},
		{idemhttp.Config{Scope: scope, MinBackoff: time.Second, MaxBackoff: time.Millisecond}, "MaxBackoff cannot be less than MinBackoff"},
	} {
		_, err := idemhttp.Middleware(&pgxBeginner{}, &tt.cfg)
		require.ErrorContains(t, err, tt.want)
		require.True(t, strings.HasPrefix(err.Error(), "idemhttp: "), err.Error())
	}
	_, err := idemhttp.Middleware(&pgxBeginner{}, nil)
	require.ErrorContains(t, err, "idemhttp: Config cannot be nil")
	_, err = idemhttp.Middleware(nil, &idemhttp.Config{Scope: scope})
	require.ErrorContains(t, err, "idemhttp: db cannot be nil")
	_, err = idemhttp.Middleware(&pgxBeginner{}, &idemhttp.Config{Scope: scope, MinBackoff: time.Second})
	require.NoError(t, err, "a MinBackoff above the default MaxBackoff raises MaxBackoff with it")
}

// pgxBeginner is never asked to begin anything: validation happens before any request.
type pgxBeginner struct{ pgx.Tx }

// TestConfigStoreSettings checks that the settings passed on to idem.Do and tx.Run are used.
func TestConfigStoreSettings(t *testing.T) {
	t.Parallel()

	t.Run("TTL", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{TTL: 90 * time.Minute})(http.HandlerFunc(b.create))
		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/effects", "k1", "")).Code)
		var ttl time.Duration
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT expires_at - created_at FROM idem_keys`).Scan(&ttl))
		require.InDelta(t, 90*time.Minute, ttl, float64(time.Minute))
	})

	t.Run("InFlightRetryAfter", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		inside := make(chan struct{})
		release := make(chan struct{})
		h := b.middleware(t, &idemhttp.Config{InFlightRetryAfter: 7 * time.Second})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(inside)
			<-release
			b.create(w, r)
		}))
		done := make(chan int)
		go func() { done <- serve(h, request("POST", "/effects", "k1", "")).Code }()
		<-inside
		w := serve(h, request("POST", "/effects", "k1", ""))
		close(release)
		problem(t, w, http.StatusConflict, "idempotency-key-in-flight")
		require.Equal(t, "7", w.Header().Get("Retry-After"))
		require.Equal(t, http.StatusCreated, <-done)
	})

	t.Run("Schema", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, idem.Migrate(b.ctx, b.pool, idem.Schema("web")))
		h := b.middleware(t, &idemhttp.Config{Schema: "web"})(http.HandlerFunc(b.create))
		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/effects", "k1", "")).Code)
		var inWeb, inPublic int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM web.idem_keys), (SELECT count(*) FROM public.idem_keys)`).Scan(&inWeb, &inPublic))
		require.Equal(t, 1, inWeb)
		require.Zero(t, inPublic)
	})

	t.Run("Isolation", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var level string
		h := b.middleware(t, &idemhttp.Config{Isolation: pgx.Serializable})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t, _ := idemhttp.Tx(r.Context())
			_ = t.QueryRow(r.Context(), `SHOW transaction_isolation`).Scan(&level)
			w.WriteHeader(http.StatusNoContent)
		}))
		require.Equal(t, http.StatusNoContent, serve(h, request("POST", "/effects", "k1", "")).Code)
		require.Equal(t, "serializable", level)
	})
}
