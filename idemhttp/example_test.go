package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemtest"
)

// examplePool returns a pool on a fresh database with idem migrated and an orders table. The
// caller closes it.
func examplePool(ctx context.Context) *pgxpool.Pool {
	pool := idemtest.NewExamplePool(nil)
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, sku text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	return pool
}

// createOrder writes through the request's transaction, so the order commits exactly when the
// response is stored.
func createOrder(w http.ResponseWriter, r *http.Request) {
	t, ok := idemhttp.Tx(r.Context())
	if !ok {
		http.Error(w, "send an Idempotency-Key", http.StatusBadRequest)
		return
	}
	sku, _ := io.ReadAll(r.Body)
	var id int64
	if err := t.QueryRow(r.Context(), `INSERT INTO orders (sku) VALUES ($1) RETURNING id`, string(sku)).Scan(&id); err != nil {
		http.Error(w, "database error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "order %d\n", id)
}

func ExampleMiddleware() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	mw, err := idemhttp.Middleware(pool, &idemhttp.Config{
		// Keys are kept per principal. A real application returns the authenticated user.
		Scope: func(r *http.Request) string { return "user:" + r.Header.Get("X-User") },
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", createOrder)
	srv := httptest.NewServer(mw(mux))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader("A-1"))
		req.Header.Set("X-User", "42")
		req.Header.Set("Idempotency-Key", `"order-7f3a"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%s %s replayed=%q %s", resp.Status, resp.Header.Get("Location"), resp.Header.Get("Idempotent-Replayed"), body)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 Created /orders/1 replayed="" order 1
	// 201 Created /orders/1 replayed="true" order 1
	// orders: 1
}

func ExampleTransport() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	mw, err := idemhttp.Middleware(pool, &idemhttp.Config{
		Scope: func(r *http.Request) string { return "user:" + r.Header.Get("X-User") },
	})
	if err != nil {
		log.Fatal(err)
	}
	// The first attempt fails with a 503, as a server under load might. A 5xx is never
	// stored, so the Transport's retry, under the same key, runs the handler afresh.
	var (
		mu       sync.Mutex
		attempts int
		keys     = map[string]bool{}
	)
	flaky := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		attempts++
		n := attempts
		keys[r.Header.Get("Idempotency-Key")] = true
		mu.Unlock()
		if n == 1 {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		createOrder(w, r)
	})
	srv := httptest.NewServer(mw(flaky))
	defer srv.Close()

	client := &http.Client{Transport: &idemhttp.Transport{MinBackoff: time.Millisecond}}
	req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader("A-1"))
	req.Header.Set("X-User", "42")
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%s %s", resp.Status, body)
	fmt.Println("attempts:", attempts, "distinct keys:", len(keys))
	// Output:
	// 201 Created order 1
	// attempts: 2 distinct keys: 1
}

func ExampleRoute() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	mw, err := idemhttp.Middleware(pool, &idemhttp.Config{
		Scope: func(r *http.Request) string { return "user:" + r.Header.Get("X-User") },
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	// Keys are optional by default; this route requires one.
	mux.Handle("POST /orders", mw(idemhttp.Route(&idemhttp.RouteConfig{Key: idemhttp.KeyRequired}, http.HandlerFunc(createOrder))))

	req := httptest.NewRequest("POST", "/orders", strings.NewReader("A-1"))
	req.Header.Set("X-User", "42")
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	fmt.Println(w.Code, w.Header().Get("Content-Type"))
	// Output:
	// 400 application/problem+json
}

func ExampleParseKey() {
	for _, v := range []string{`"8e03978e-40d5"`, `8e03978e-40d5`, `"a\"b"`, `has space`} {
		id, err := idemhttp.ParseKey(v)
		fmt.Printf("%q %v\n", id, err)
	}
	// Output:
	// "8e03978e-40d5" <nil>
	// "8e03978e-40d5" <nil>
	// "a\"b" <nil>
	// "" idem: invalid key: ID has byte 0x20 at offset 3; only printable ASCII (0x21-0x7E, no spaces) is allowed
}

func ExampleCanonicalJSON() {
	a, _ := idemhttp.CanonicalJSON([]byte(`{ "b": [1, 2.0], "a": "\u00e9" }`))
	b, _ := idemhttp.CanonicalJSON([]byte(`{"a":"é","b":[1,2.0]}`))
	fmt.Println(string(a), string(a) == string(b))
	// Output:
	// {"a":"é","b":[1,2.0]} true
}
