package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// Route attaches per-route configuration to a handler. The middleware reads it before anything
// else (it must: the fingerprint decides between running and replaying), so it applies where the
// middleware can see it:
//
//   - when the middleware wraps the Route directly, mw(idemhttp.Route(rc, h)), as when it is
//     applied per route;
//   - when the middleware wraps a whole router and Config.Route returns the same rc for the
//     request.
//
// A Route reached by a guarded request whose middleware applied other settings answers 500
// (idempotency-misconfigured) instead of running under the wrong ones: the mistake shows on the
// first request rather than as a silently optional key. A Route reached by a request no
// middleware guarded calls h as is.
//
//	mw, _ := idemhttp.Middleware(pool, cfg)
//	mux.Handle("POST /payments", mw(idemhttp.Route(&idemhttp.RouteConfig{
//		Key:   idemhttp.KeyRequired,
//		Store: func(status int) bool { return status < 400 }, // retry 4xx afresh
//	}, payments)))
func Route(rc *RouteConfig, h http.Handler) http.Handler {
	if rc == nil {
		rc = &RouteConfig{}
	}
	return &routeHandler{rc: rc, h: h}
}

type routeHandler struct {
	rc *RouteConfig
	h  http.Handler
}

func (rh *routeHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if st, ok := r.Context().Value(ctxKey{}).(*guardState); ok && st.rc != rh.rc {
		st.m.cfg.Logger.ErrorContext(r.Context(), "idemhttp: a Route's configuration was not applied by the middleware guarding it; wrap the Route directly with the middleware, or return its RouteConfig from Config.Route", "path", r.URL.Path)
		st.m.writeProblem(w, problemMisconfigured, 0, 0, "The server's idempotency settings for this route are misconfigured. This is a server bug; the request did not run.")
		return
	}
	rh.h.ServeHTTP(w, r)
}

// Tx returns the transaction of the guarded request ctx belongs to: the one that holds the
// idempotency key and commits with the stored response. Write through it, and insert River jobs
// with InsertTx on it (the transactional outbox), so that the effects commit exactly when the
// response is stored. ok is false when the request is not guarded (no key, or a method the
// middleware does not guard); the handler then has to use a transaction of its own.
//
// The middleware commits or rolls back: the transaction's Commit and Rollback return an error.
// Savepoints (Begin) work as usual.
//
//	func createOrder(w http.ResponseWriter, r *http.Request) {
//		t, ok := idemhttp.Tx(r.Context())
//		if !ok {
//			http.Error(w, "send an Idempotency-Key", http.StatusBadRequest)
//			return
//		}
//		var id int64
//		if err := t.QueryRow(r.Context(), `INSERT INTO orders DEFAULT VALUES RETURNING id`).Scan(&id); err != nil {
//			http.Error(w, "database error", http.StatusInternalServerError) // 5xx: rolled back
//			return
//		}
//		_, _ = riverClient.InsertTx(r.Context(), t, SendReceiptArgs{OrderID: id}, nil)
//		w.WriteHeader(http.StatusCreated)
//	}
func Tx(ctx context.Context) (pgx.Tx, bool) {
	st, ok := ctx.Value(ctxKey{}).(*guardState)
	if !ok || st.tx == nil {
		return nil, false
	}
	return st.tx, true
}

// Key returns the idempotency key of the guarded request ctx belongs to, as the middleware uses
// it: the scope from Config.Scope, the ID parsed from the Idempotency-Key header (unquoted) and
// the request's fingerprint. ok is false when [Tx] has no transaction for ctx either: the
// request has no key, or a method the middleware does not guard. Use it to record which
// request a row belongs to, or to derive keys for calls to other services, without parsing the
// header again.
//
//	func createOrder(w http.ResponseWriter, r *http.Request) {
//		t, _ := idemhttp.Tx(r.Context())
//		key, _ := idemhttp.Key(r.Context())
//		_, err := t.Exec(r.Context(), `INSERT INTO orders (scope, request_key) VALUES ($1, $2)`,
//			key.Scope, key.ID)
//		...
//	}
func Key(ctx context.Context) (idem.Key, bool) {
	st, ok := ctx.Value(ctxKey{}).(*guardState)
	if !ok || st.tx == nil {
		return idem.Key{}, false
	}
	return st.key, true
}

// HeaderScope returns a Config.Scope that scopes keys by the value of a request header, such as
// an API key: the scope is the header's name and a SHA-256 digest of its value, so the credential
// itself is not stored. A request without the header has no scope (and gets a 400 if it carries
// an idempotency key). A request that carries the header more than once names more than one
// identity, and taking either would file the key under a guess: it gets a 400
// (idempotency-scope-ambiguous) and nothing runs.
//
// Use it only for a header that stays the same across retries of a request. A bearer token
// that is refreshed between a request and its retry would change the scope, and the retry would
// run again; scope by the user or client the token stands for instead.
//
//	cfg := &idemhttp.Config{Scope: idemhttp.HeaderScope("X-Api-Key")}
func HeaderScope(name string) func(r *http.Request) string {
	prefix := strings.ToLower(name) + ":"
	return func(r *http.Request) string {
		vs := r.Header.Values(name)
		switch {
		case len(vs) > 1:
			return ambiguousScope + name
		case len(vs) == 0 || vs[0] == "":
			return ""
		}
		sum := sha256.Sum256([]byte(vs[0]))
		return prefix + hex.EncodeToString(sum[:])
	}
}

// ambiguousScope starts what HeaderScope returns for a repeated header, followed by the header's
// name. The NUL makes it a scope that idem.Key.Validate refuses, so it can never be taken for
// one, should it reach idem some other way.
const ambiguousScope = "\x00idemhttp: repeated scope header\x00"
