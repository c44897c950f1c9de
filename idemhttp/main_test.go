package idemhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	runs atomic.Int64 // handler executions, rolled back or not
}

// setup gives each test its own database with idem migrated and a table of effects, so that
// tests count what committed instead of trusting responses.
func setup(t testing.TB) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	require.NoError(t, idem.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, note text NOT NULL)`)
	require.NoError(t, err)
	return &testBundle{ctx: ctx, pool: pool}
}

// userScope scopes keys by a test header; real applications use their authenticated principal.
func userScope(r *http.Request) string { return r.Header.Get("X-User") }

// middleware builds the middleware over b.pool; cfg may be nil for the tests' defaults.
func (b *testBundle) middleware(t testing.TB, cfg *idemhttp.Config) func(http.Handler) http.Handler {
	t.Helper()
	if cfg == nil {
		cfg = &idemhttp.Config{}
	}
	if cfg.Scope == nil {
		cfg.Scope = userScope
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	mw, err := idemhttp.Middleware(b.pool, cfg)
	require.NoError(t, err)
	return mw
}

// create is the business handler used throughout: it counts its run, writes one effect row
// through the request's transaction and answers 201 with the row's id.
func (b *testBundle) create(w http.ResponseWriter, r *http.Request) {
	b.runs.Add(1)
	t, ok := idemhttp.Tx(r.Context())
	if !ok {
		http.Error(w, "not guarded", http.StatusTeapot)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var id int64
	if err := t.QueryRow(r.Context(), `INSERT INTO effects (note) VALUES ($1) RETURNING id`, string(body)).Scan(&id); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/effects/"+itoa(id))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]int64{"id": id})
}

// effects counts committed effect rows.
func (b *testBundle) effects(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects`).Scan(&n))
	return n
}

// storedKeys counts rows in idem_keys.
func (b *testBundle) storedKeys(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_keys`).Scan(&n))
	return n
}

// request builds a keyed POST from user alice; key "" means no header.
func request(method, target, key, body string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Header.Set("X-User", "alice")
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

// serve runs one request through h and returns the recorded response.
func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// problem decodes a problem response and checks its framing.
func problem(t testing.TB, w *httptest.ResponseRecorder, status int, name string) idemhttp.Problem {
	t.Helper()
	require.Equal(t, status, w.Code, w.Body.String())
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var p idemhttp.Problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	require.Equal(t, idemhttp.DefaultProblemTypeBase+name, p.Type)
	require.Equal(t, status, p.Status)
	require.NotEmpty(t, p.Title)
	require.NotEmpty(t, p.Detail)
	return p
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// testLogger sends the middleware's server-side errors to the test's output, where they show
// with the test that caused them (go test -v, or when it fails).
func testLogger(t testing.TB) *slog.Logger { return slog.New(slog.NewTextHandler(t.Output(), nil)) }
