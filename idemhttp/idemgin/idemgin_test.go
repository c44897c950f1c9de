package idemgin_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemhttp/idemgin"
	"github.com/idemkit/idem/idemtest"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(idemtest.Main(m))
}

type testBundle struct {
	pool   *pgxpool.Pool
	router *gin.Engine
	runs   atomic.Int64
}

// setup routes POST /orders through the middleware to a handler that writes an order through
// the request's transaction and answers with gin's JSON renderer.
func setup(t *testing.T, rc *idemhttp.RouteConfig) *testBundle {
	t.Helper()
	b := &testBundle{pool: idemtest.NewPool(t, nil)}
	if _, err := b.pool.Exec(t.Context(), `CREATE TABLE orders (id bigserial PRIMARY KEY, sku text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.Middleware(b.pool, &idemhttp.Config{
		Scope:  func(r *http.Request) string { return r.Header.Get("X-User") },
		Route:  func(*http.Request) *idemhttp.RouteConfig { return rc },
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	b.router = gin.New()
	b.router.Use(gin.Recovery())
	b.router.POST("/orders", idemgin.Middleware(mw), func(c *gin.Context) {
		b.runs.Add(1)
		t, ok := idemhttp.Tx(c.Request.Context())
		if !ok {
			c.JSON(http.StatusAccepted, gin.H{"guarded": false})
			return
		}
		var req struct{ SKU string }
		if err := c.ShouldBindJSON(&req); err != nil || req.SKU == "" {
			c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": "send a sku"})
			return
		}
		var id int64
		if err := t.QueryRow(c.Request.Context(), `INSERT INTO orders (sku) VALUES ($1) RETURNING id`, req.SKU).Scan(&id); err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
			return
		}
		if req.SKU == "fail" {
			c.JSON(http.StatusServiceUnavailable, gin.H{"error": "try again"})
			return
		}
		c.JSON(http.StatusCreated, gin.H{"id": id, "sku": req.SKU})
	})
	return b
}

func (b *testBundle) post(key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
	r.Header.Set("X-User", "alice")
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	b.router.ServeHTTP(w, r)
	return w
}

func (b *testBundle) orders(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMiddleware(t *testing.T) {
	t.Parallel()

	t.Run("RunsOnceAndReplays", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		first := b.post("k1", `{"sku":"A-1"}`)
		again := b.post("k1", `{ "sku" : "A-1" }`)
		if first.Code != http.StatusCreated || again.Code != http.StatusCreated {
			t.Fatalf("got %d then %d, want 201 twice: %s %s", first.Code, again.Code, first.Body, again.Body)
		}
		if first.Body.String() != again.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the retry must replay the first answer: %q %q (replayed %q)", first.Body, again.Body, again.Header().Get("Idempotent-Replayed"))
		}
		// gin's renderer sets Content-Type after the status; the stored response has it.
		if ct := again.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("replayed Content-Type %q, want JSON", ct)
		}
		var order struct{ ID int64 }
		if err := json.Unmarshal(first.Body.Bytes(), &order); err != nil || order.ID != 1 {
			t.Fatalf("body %s: %v", first.Body, err)
		}
		if b.runs.Load() != 1 || b.orders(t) != 1 {
			t.Fatalf("%d runs, %d orders; want one of each", b.runs.Load(), b.orders(t))
		}
	})

	t.Run("AnswersOfTheMiddlewareStopTheChain", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &idemhttp.RouteConfig{Key: idemhttp.KeyRequired})
		w := b.post("", `{"sku":"A-1"}`)
		if w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Fatalf("got %d %s, want the middleware's 400 problem", w.Code, w.Header().Get("Content-Type"))
		}
		w = b.post("k1", `{"sku":"A-1"}`)
		if w.Code != http.StatusCreated {
			t.Fatalf("got %d, want 201", w.Code)
		}
		w = b.post("k1", `{"sku":"B-2"}`)
		if w.Code != http.StatusUnprocessableEntity {
			t.Fatalf("a reused key got %d, want 422", w.Code)
		}
		if b.runs.Load() != 1 {
			t.Fatalf("the handler ran %d times, want once", b.runs.Load())
		}
	})

	t.Run("5xxRollsBackAndAbortIsStored", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		if w := b.post("k1", `{"sku":"fail"}`); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("got %d, want 503", w.Code)
		}
		if b.orders(t) != 0 {
			t.Fatal("a 5xx must roll the order back")
		}
		bad := b.post("k2", `{}`)
		replay := b.post("k2", `{}`)
		if bad.Code != http.StatusBadRequest || replay.Header().Get("Idempotent-Replayed") != "true" || replay.Body.String() != bad.Body.String() {
			t.Fatalf("AbortWithStatusJSON's 400 must be stored and replayed: %d %s / %d %s", bad.Code, bad.Body, replay.Code, replay.Body)
		}
	})

	t.Run("UnkeyedPassesThrough", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		w := b.post("", `{"sku":"A-1"}`)
		if w.Code != http.StatusAccepted || !strings.Contains(w.Body.String(), `"guarded":false`) {
			t.Fatalf("got %d %s, want the handler's own unguarded answer", w.Code, w.Body)
		}
	})
}
