package idemhttp_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// TestMiddleware walks the status table in Middleware's doc comment, one row per subtest.
func TestMiddleware(t *testing.T) {
	t.Parallel()

	t.Run("FirstRunStoresThenReplays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(b.create))

		first := serve(h, request("POST", "/effects", "k1", `{"a":1}`))
		require.Equal(t, http.StatusCreated, first.Code)
		require.Empty(t, first.Header().Get("Idempotent-Replayed"))
		require.Equal(t, "/effects/1", first.Header().Get("Location"))
		require.JSONEq(t, `{"id":1}`, first.Body.String())

		for range 2 {
			again := serve(h, request("POST", "/effects", `"k1"`, `{ "a" : 1 }`))
			require.Equal(t, http.StatusCreated, again.Code)
			require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
			require.Equal(t, "/effects/1", again.Header().Get("Location"))
			require.Equal(t, first.Body.Bytes(), again.Body.Bytes())
		}
		require.EqualValues(t, 1, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
	})

	t.Run("InFlightIs409WithRetryAfter", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		entered, release := make(chan struct{}), make(chan struct{})
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			b.create(w, r)
		}))
		done := make(chan int)
		go func() { done <- serve(h, request("POST", "/effects", "k1", "")).Code }()
		<-entered

		w := serve(h, request("POST", "/effects", "k1", ""))
		problem(t, w, http.StatusConflict, "idempotency-key-in-flight")
		require.Equal(t, "1", w.Header().Get("Retry-After"))
		require.Empty(t, w.Header().Get("Idempotent-Replayed"))

		close(release)
		require.Equal(t, http.StatusCreated, <-done)
		require.Equal(t, "true", serve(h, request("POST", "/effects", "k1", "")).Header().Get("Idempotent-Replayed"))
		require.Equal(t, 1, b.effects(t))
	})

	t.Run("DifferentRequestUnderKeyIs422", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(b.create))
		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/effects", "k1", `{"amount":100}`)).Code)

		for _, r := range []*http.Request{
			request("POST", "/effects", "k1", `{"amount":200}`),
			request("POST", "/other", "k1", `{"amount":100}`),
			request("POST", "/effects?x=1", "k1", `{"amount":100}`),
			request("PATCH", "/effects", "k1", `{"amount":100}`),
		} {
			w := serve(h, r)
			problem(t, w, http.StatusUnprocessableEntity, "idempotency-key-reused")
		}
		require.EqualValues(t, 1, b.runs.Load())
	})

	t.Run("DifferentRequestUnderKeyIs400WhenConfigured", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{MismatchStatus: http.StatusBadRequest})(http.HandlerFunc(b.create))
		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/effects", "k1", `1`)).Code)
		problem(t, serve(h, request("POST", "/effects", "k1", `2`)), http.StatusBadRequest, "idempotency-key-reused")
	})

	t.Run("MissingKeyWhereRequiredIs400", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{RequireKey: true})(http.HandlerFunc(b.create))
		p := problem(t, serve(h, request("POST", "/effects", "", "")), http.StatusBadRequest, "idempotency-key-missing")
		require.Contains(t, p.Detail, "Idempotency-Key")
		require.Zero(t, b.runs.Load())
	})

	t.Run("MissingKeyPassesThroughUntouched", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(b.create))
		w := serve(h, request("POST", "/effects", "", ""))
		require.Equal(t, http.StatusTeapot, w.Code) // the handler ran, without a transaction
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("UnguardedMethodPassesThroughUntouched", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{RequireKey: true})(http.HandlerFunc(b.create))
		require.Equal(t, http.StatusTeapot, serve(h, request("PUT", "/effects", "k1", "")).Code)
		require.Equal(t, http.StatusTeapot, serve(h, request("GET", "/effects", "", "")).Code)
	})

	t.Run("InvalidKeyIs400", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(b.create))
		for _, key := range []string{`"`, `"unterminated`, `has space`, `"a";p=1`, `""`, `"` + strings.Repeat("x", 256) + `"`, "caf\xc3\xa9"} {
			r := request("POST", "/effects", "", "")
			r.Header.Set("Idempotency-Key", key)
			problem(t, serve(h, r), http.StatusBadRequest, "idempotency-key-invalid")
		}
		r := request("POST", "/effects", "k1", "")
		r.Header.Add("Idempotency-Key", "k2")
		p := problem(t, serve(h, r), http.StatusBadRequest, "idempotency-key-invalid")
		require.Contains(t, p.Detail, "2 Idempotency-Key headers")

		r = request("POST", "/effects", "", "")
		r.Header["Idempotency-Key"] = []string{""}
		problem(t, serve(h, r), http.StatusBadRequest, "idempotency-key-invalid")
		require.Zero(t, b.runs.Load())
	})

	t.Run("ProblemDetailsEchoLittleOfTheRequest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{RequireKey: true})(http.HandlerFunc(b.create))
		// A client controls the header and the path, up to the server's header limit (1 MB
		// by default). The detail quotes a little of them, never all.
		tail := strings.Repeat("A", 1<<20)
		for _, value := range []string{`"k1";` + tail, `"k1" ` + tail} {
			r := request("POST", "/effects", "", "")
			r.Header.Set("Idempotency-Key", value)
			p := problem(t, serve(h, r), http.StatusBadRequest, "idempotency-key-invalid")
			require.Less(t, len(p.Detail), 1100, "the detail echoes the header")
			require.Contains(t, p.Detail, "AAAA", "the detail should still show where the header went wrong")
		}
		p := problem(t, serve(h, request("POST", "/"+tail, "", "")), http.StatusBadRequest, "idempotency-key-missing")
		require.Less(t, len(p.Detail), 1100, "the detail echoes the path")
		require.Zero(t, b.runs.Load())
	})

	t.Run("NoIdentityIs400", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(b.create))
		r := request("POST", "/effects", "k1", "")
		r.Header.Del("X-User")
		problem(t, serve(h, r), http.StatusBadRequest, "idempotency-scope-missing")
		require.Zero(t, b.runs.Load())
	})

	t.Run("InvalidScopeIs500", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{Scope: func(*http.Request) string { return strings.Repeat("s", 256) }, Logger: testLogger(t)})(http.HandlerFunc(b.create))
		problem(t, serve(h, request("POST", "/effects", "k1", "")), http.StatusInternalServerError, "idempotency-misconfigured")
		require.Zero(t, b.runs.Load())
	})

	t.Run("BodyOverCapIs413", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{MaxBodyBytes: 10})(http.HandlerFunc(b.create))
		problem(t, serve(h, request("POST", "/effects", "k1", strings.Repeat("x", 11))), http.StatusRequestEntityTooLarge, "request-body-too-large")

		// Without a Content-Length, the cap is found while reading.
		r := request("POST", "/effects", "k1", "")
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader(strings.Repeat("x", 11))), -1
		problem(t, serve(h, r), http.StatusRequestEntityTooLarge, "request-body-too-large")

		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/effects", "k1", strings.Repeat("x", 10))).Code)
		require.EqualValues(t, 1, b.runs.Load())
	})

	t.Run("Handler5xxRollsBackAndRetryRunsFresh", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fail := true
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if fail {
				b.runs.Add(1)
				dbtx, _ := idemhttp.Tx(r.Context())
				_, err := dbtx.Exec(r.Context(), `INSERT INTO effects (note) VALUES ('doomed')`)
				require.NoError(t, err)
				w.Header().Set("X-Failed", "yes")
				http.Error(w, "upstream down", http.StatusBadGateway)
				return
			}
			b.create(w, r)
		}))
		w := serve(h, request("POST", "/effects", "k1", ""))
		require.Equal(t, http.StatusBadGateway, w.Code)
		require.Equal(t, "yes", w.Header().Get("X-Failed"))
		require.Equal(t, "upstream down\n", w.Body.String())
		require.Zero(t, b.effects(t))
		require.Zero(t, b.storedKeys(t))

		fail = false
		w = serve(h, request("POST", "/effects", "k1", ""))
		require.Equal(t, http.StatusCreated, w.Code)
		require.Empty(t, w.Header().Get("Idempotent-Replayed"))
		require.EqualValues(t, 2, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
	})

	t.Run("PanicRollsBackAndRepanics", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dbtx, _ := idemhttp.Tx(r.Context())
			_, _ = dbtx.Exec(r.Context(), `INSERT INTO effects (note) VALUES ('doomed')`)
			w.WriteHeader(http.StatusCreated)
			panic(http.ErrAbortHandler)
		}))
		w := httptest.NewRecorder()
		require.PanicsWithValue(t, http.ErrAbortHandler, func() { h.ServeHTTP(w, request("POST", "/effects", "k1", "")) })
		require.False(t, w.Flushed)
		require.Zero(t, w.Body.Len(), "nothing of the rolled-back response reached the client")
		require.Empty(t, w.Header().Get("Content-Type"))
		require.Zero(t, b.effects(t))
		require.Zero(t, b.storedKeys(t))
		// The key is free: a retry runs (and here panics) again rather than getting 409.
		require.Panics(t, func() { h.ServeHTTP(httptest.NewRecorder(), request("POST", "/effects", "k1", "")) })
	})

	t.Run("Handler4xxIsStoredAndReplayed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b.runs.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusPaymentRequired)
			_, _ = io.WriteString(w, `{"error":"card_declined"}`)
		}))
		first := serve(h, request("POST", "/pay", "k1", ""))
		require.Equal(t, http.StatusPaymentRequired, first.Code)
		again := serve(h, request("POST", "/pay", "k1", ""))
		require.Equal(t, http.StatusPaymentRequired, again.Code)
		require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
		require.Equal(t, `{"error":"card_declined"}`, again.Body.String())
		require.EqualValues(t, 1, b.runs.Load())
	})

	t.Run("StorePredicateFalseRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		notFound := true
		h := b.middleware(t, &idemhttp.Config{Store: func(status int) bool { return status < 400 }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if notFound {
				b.runs.Add(1)
				http.NotFound(w, r)
				return
			}
			b.create(w, r)
		}))
		require.Equal(t, http.StatusNotFound, serve(h, request("POST", "/effects", "k1", "")).Code)
		require.Zero(t, b.storedKeys(t))
		notFound = false
		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/effects", "k1", "")).Code)
		require.EqualValues(t, 2, b.runs.Load())
	})

	t.Run("StorePredicateCannotStore5xx", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{Store: func(int) bool { return true }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "boom", http.StatusServiceUnavailable)
		}))
		require.Equal(t, http.StatusServiceUnavailable, serve(h, request("POST", "/effects", "k1", "")).Code)
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("StreamingIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var flushErr error
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dbtx, _ := idemhttp.Tx(r.Context())
			_, _ = dbtx.Exec(r.Context(), `INSERT INTO effects (note) VALUES ('doomed')`)
			_, _ = io.WriteString(w, "event: 1\n\n")
			flushErr = http.NewResponseController(w).Flush()
		}))
		w := serve(h, request("POST", "/events", "k1", ""))
		require.ErrorIs(t, flushErr, idemhttp.ErrStreaming)
		problem(t, w, http.StatusInternalServerError, "streaming-response-refused")
		require.NotContains(t, w.Body.String(), "event: 1")
		require.Zero(t, b.effects(t))
		require.Zero(t, b.storedKeys(t))

		// http.Flusher, which cannot report an error, is refused the same way.
		h = b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush()
		}))
		problem(t, serve(h, request("POST", "/events", "k2", "")), http.StatusInternalServerError, "streaming-response-refused")
	})

	t.Run("ResponseOverCapIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var writeErr error
		h := b.middleware(t, &idemhttp.Config{MaxResponseBytes: 4})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, writeErr = io.WriteString(w, "12345")
		}))
		problem(t, serve(h, request("POST", "/big", "k1", "")), http.StatusInternalServerError, "response-too-large")
		require.ErrorIs(t, writeErr, idemhttp.ErrResponseTooLarge)
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("StoreDownIs503AndHandlerDoesNotRun", func(t *testing.T) {
		t.Parallel()
		// A server that accepts and hangs up at once: Postgres "down", without the race of
		// reusing a closed port.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.Close()
			}
		}()
		pool, err := pgxpool.New(t.Context(), fmt.Sprintf("postgres://u@%s/db?sslmode=disable&connect_timeout=5", ln.Addr()))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		ran := false
		mw, err := idemhttp.Middleware(pool, &idemhttp.Config{Scope: userScope, MaxAttempts: 2, MinBackoff: time.Microsecond, Logger: testLogger(t)})
		require.NoError(t, err)
		h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
		w := serve(h, request("POST", "/effects", "k1", ""))
		problem(t, w, http.StatusServiceUnavailable, "idempotency-store-unavailable")
		require.Equal(t, "2", w.Header().Get("Retry-After"))
		require.False(t, ran)
	})

	t.Run("SerializationFailureRunsHandlerAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{MinBackoff: time.Microsecond})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if b.runs.Load() == 0 {
				b.runs.Add(1)
				dbtx, _ := idemhttp.Tx(r.Context())
				_, _ = dbtx.Exec(r.Context(), `INSERT INTO effects (note) VALUES ('first attempt')`)
				// What Postgres says when it aborts a transaction to break a conflict. The
				// handler swallows it and even claims success: the middleware still knows.
				_, err := dbtx.Exec(r.Context(), `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
				require.Error(t, err)
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, "first attempt")
				return
			}
			b.create(w, r)
		}))
		w := serve(h, request("POST", "/effects", "k1", "second attempt"))
		require.Equal(t, http.StatusCreated, w.Code)
		require.JSONEq(t, `{"id":2}`, w.Body.String()) // id 1 was the rolled-back attempt's
		require.EqualValues(t, 2, b.runs.Load())
		var note string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT string_agg(note, ',') FROM effects`).Scan(&note))
		require.Equal(t, "second attempt", note)
	})

	t.Run("FailedStatementAnswered4xxIsSentUnstored", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dbtx, _ := idemhttp.Tx(r.Context())
			_, err := dbtx.Exec(r.Context(), `INSERT INTO effects (id, note) VALUES (1, 'x'), (1, 'x')`)
			require.Error(t, err) // a unique violation, which the handler maps to 409
			http.Error(w, "already exists", http.StatusConflict)
		}))
		w := serve(h, request("POST", "/effects", "k1", ""))
		require.Equal(t, http.StatusConflict, w.Code)
		require.Equal(t, "already exists\n", w.Body.String())
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("FailedStatementAnsweredSuccessIs500", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{Logger: testLogger(t)})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dbtx, _ := idemhttp.Tx(r.Context())
			_, _ = dbtx.Exec(r.Context(), `SELECT 1/0`)
			w.WriteHeader(http.StatusCreated)
		}))
		problem(t, serve(h, request("POST", "/effects", "k1", "")), http.StatusInternalServerError, "handler-transaction-failed")
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("HandlerCannotEndTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dbtx, _ := idemhttp.Tx(r.Context())
			require.Error(t, dbtx.Commit(r.Context()))
			require.Error(t, dbtx.Rollback(r.Context()))
			// Savepoints work.
			sp, err := dbtx.Begin(r.Context())
			require.NoError(t, err)
			_, err = sp.Exec(r.Context(), `INSERT INTO effects (note) VALUES ('undone')`)
			require.NoError(t, err)
			require.NoError(t, sp.Rollback(r.Context()))
			b.create(w, r)
		}))
		require.Equal(t, http.StatusCreated, serve(h, request("POST", "/effects", "k1", "kept")).Code)
		require.Equal(t, 1, b.effects(t))
	})
}
