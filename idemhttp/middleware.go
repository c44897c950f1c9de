package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/telemetry"
	"github.com/idemkit/idem/internal/txwatch"
	"github.com/idemkit/idem/tx"
)

// Middleware returns net/http middleware that makes the requests it guards safe to retry: a
// request carrying an Idempotency-Key runs its handler at most once per key and scope, and every
// retry gets the first answer back. It works with anything that takes a
// func(http.Handler) http.Handler (net/http, chi's Use, gorilla's Use); for gin and echo, see
// the package documentation.
//
// For a guarded request (a POST or PATCH, see Config.Methods) with a key, the middleware parses
// the key (400 if malformed), finds the scope (Config.Scope), reads the body (413 above
// Config.MaxBodyBytes) and fingerprints the request. Then, in a transaction run by [tx.Run], it
// calls [idem.Do] around the handler. The handler writes to a buffer, never to the client, and
// reaches the transaction through [Tx]: what it writes there (rows, River jobs inserted with
// InsertTx) commits together with its stored response, or not at all. Only after the commit is
// the response sent. Because nothing has left the process before the commit, tx.Run can run the
// handler again when Postgres aborts the transaction with a serialization failure or deadlock,
// or when a concurrent duplicate wins a race (the rerun then replays).
//
// Outcomes, and what the client gets:
//
//	handler answers < 500 (Config.Store)    its response, stored; later: replayed + Idempotent-Replayed: true
//	handler answers 5xx, or Store says no    its response, not stored; the transaction rolls back
//	handler panics                           the transaction rolls back, then the panic continues
//	key in use by a request in progress      409 + Retry-After (idempotency-key-in-flight)
//	key reused for a different request       422, or 400 with Config.MismatchStatus
//	no key where the route requires one      400 (idempotency-key-missing)
//	key malformed                            400 (idempotency-key-invalid)
//	no identity (Config.Scope returned "")   400 (idempotency-scope-missing)
//	HeaderScope's header sent twice          400 (idempotency-scope-ambiguous)
//	body over Config.MaxBodyBytes            413 (request-body-too-large)
//	handler flushes (streams)                500, rolled back (streaming-response-refused)
//	Postgres unreachable or failing          503 + Retry-After; the handler did not run, or was rolled back
//
// Errors the middleware produces itself are RFC 9457 problems ([Problem]). Requests without a
// key (where not required) and requests with other methods pass through untouched: no
// transaction is begun and the handler writes straight to the client.
//
// On a panic the middleware does not answer 500 itself: the transaction is rolled back first
// (so the key is free and nothing is stored), and then the panic goes on to the server or to a
// recovery middleware, which answer as they do for any other handler.
//
//	mw, err := idemhttp.Middleware(pool, &idemhttp.Config{
//		Scope: func(r *http.Request) string { return "user:" + userID(r.Context()) },
//	})
//	if err != nil {
//		return err
//	}
//	mux := http.NewServeMux()
//	mux.HandleFunc("POST /orders", createOrder)
//	http.ListenAndServe(":8080", mw(mux))
func Middleware(db tx.Beginner, cfg *Config) (func(http.Handler) http.Handler, error) {
	if db == nil {
		return nil, errors.New("idemhttp: db cannot be nil: pass the *pgxpool.Pool that holds idem's tables")
	}
	s, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	m := &middleware{db: db, cfg: s, tracer: telemetry.For(s.TracerProvider, s.MeterProvider).Tracer}
	return func(next http.Handler) http.Handler {
		var static *RouteConfig
		if rh, ok := next.(*routeHandler); ok {
			static = rh.rc
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next, static)
		})
	}, nil
}

type middleware struct {
	db     tx.Beginner
	cfg    *settings
	tracer trace.Tracer // idem's tracer on cfg's providers, the one idem.Do uses too
}

// guardState travels in the request context of a guarded request.
type guardState struct {
	m   *middleware
	rc  *RouteConfig
	tx  pgx.Tx   // nil when the request has no key
	key idem.Key // set with tx
}

type ctxKey struct{}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, static *RouteConfig) {
	if !m.cfg.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	rc := static
	if rc == nil && m.cfg.Route != nil {
		rc = m.cfg.Route(r)
	}
	rt := m.cfg.resolve(rc)

	values := r.Header.Values(m.cfg.KeyHeader)
	if len(values) == 0 {
		if rt.required {
			m.writeProblem(w, problemKeyMissing, 0, 0, fmt.Sprintf("%s %s requires an %s header. Send a unique value, such as a UUID, and reuse it on every retry of this request.", r.Method, excerpt(r.URL.Path), m.cfg.KeyHeader))
			return
		}
		// Marked, so that a Route further in can tell it was configured (see Route).
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, &guardState{m: m, rc: rc})))
		return
	}
	if len(values) > 1 {
		m.writeProblem(w, problemKeyInvalid, 0, 0, fmt.Sprintf("The request has %d %s headers. Send exactly one.", len(values), m.cfg.KeyHeader))
		return
	}
	id, err := ParseKey(values[0])
	if err != nil {
		m.writeProblem(w, problemKeyInvalid, 0, 0, fmt.Sprintf("The %s header is not valid (%v). Send 1 to 255 printable ASCII characters without spaces, such as a UUID, bare or as a quoted string.", m.cfg.KeyHeader, err))
		return
	}
	key := idem.Key{Scope: m.cfg.Scope(r), ID: id}
	if header, ok := strings.CutPrefix(key.Scope, ambiguousScope); ok {
		m.writeProblem(w, problemScopeAmbiguous, 0, 0, fmt.Sprintf("The request has more than one %s header, which names the identity its %s is kept under. Send exactly one.", excerpt(header), m.cfg.KeyHeader))
		return
	}
	if key.Scope == "" {
		m.writeProblem(w, problemNoScope, 0, 0, fmt.Sprintf("The request carries an %s but no identity to keep the key under. Authenticate the request, or send it without the key.", m.cfg.KeyHeader))
		return
	}
	if err := key.Validate(); err != nil {
		m.cfg.Logger.ErrorContext(r.Context(), "idemhttp: Config.Scope returned an invalid scope; hash long identities", "error", err)
		m.writeProblem(w, problemMisconfigured, 0, 0, "The server could not derive a valid scope for this request. This is a server bug; the request did not run.")
		return
	}
	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	key.Fingerprint = rt.fingerprint(r, body)
	m.guard(w, r, next, rt, key, body)
}

func (m *middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := m.cfg.MaxBodyBytes
	tooLarge := func() ([]byte, bool) {
		m.writeProblem(w, problemBodyTooLarge, 0, 0, fmt.Sprintf("The request body is larger than %d bytes, the most this server accepts under an idempotency key. Nothing ran.", limit))
		return nil, false
	}
	if r.ContentLength > limit {
		return tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return tooLarge()
	case err != nil:
		m.writeProblem(w, problemBodyUnreadable, 0, 0, fmt.Sprintf("The request body could not be read (%v). Nothing ran; retry the request.", err))
		return nil, false
	case int64(len(data)) > limit:
		return tooLarge()
	}
	return data, true
}

// Errors fn returns to idem.Do to roll back instead of storing.
var (
	errStreamed    = errors.New("idemhttp: the handler flushed its response")
	errRespTooBig  = errors.New("idemhttp: the handler's response exceeded MaxResponseBytes")
	errNotStorable = errors.New("idemhttp: the handler's response is not to be stored")
)

func (m *middleware) guard(w http.ResponseWriter, r *http.Request, next http.Handler, rt route, key idem.Key, body []byte) {
	ctx, span := m.tracer.Start(r.Context(), "idemhttp.request", trace.WithSpanKind(trace.SpanKindInternal))
	defer span.End()
	r = r.WithContext(ctx)
	outcome, status := "error", 0
	rk := redact.Key{Scope: key.Scope, ID: key.ID}
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(telemetry.Outcome.String(outcome), telemetry.Replayed.Bool(outcome == "replay"),
				telemetry.HTTPCode.Int(status), telemetry.Scope.String(key.Scope), m.cfg.keys.Attr(rk))
			if outcome == "error" || outcome == "unavailable" {
				span.SetStatus(codes.Error, outcome)
			}
		}
	}()
	var (
		out   StoredResponse
		fresh *recorder // the handler's response, when this request's attempt stored it
		last  *recorder // the handler's response in the last attempt, stored or not
	)
	err := tx.Run(r.Context(), m.db, func(ctx context.Context, t pgx.Tx) error {
		fresh, last = nil, nil
		var err error
		out, err = idem.Do(ctx, t, key, func(ctx context.Context, t pgx.Tx) (StoredResponse, error) {
			rec, err := m.runHandler(ctx, t, w, r, next, rt, key, body)
			last = rec
			switch {
			case err != nil:
				return StoredResponse{}, err // retryable: tx.Run runs the handler again
			case rec.streamed:
				return StoredResponse{}, errStreamed
			case rec.tooLarge:
				return StoredResponse{}, errRespTooBig
			case rec.status >= 500 || !rt.store(rec.status):
				return StoredResponse{}, errNotStorable
			}
			stored := redacted(rt, r, m.storable(rec))
			if int64(headerSize(stored.Header)+len(stored.Body)) > m.cfg.MaxResponseBytes {
				return StoredResponse{}, errRespTooBig // the headers count, or a handler could store megabytes of them
			}
			fresh = rec
			return stored, nil
		}, m.cfg.keyOpts...)
		return err
	}, m.cfg.txOpts...)

	var inFlight *idem.InFlightError
	switch {
	case err == nil && fresh != nil:
		outcome, status = "run", fresh.status
		writeResponse(w, fresh.status, fresh.sent, fresh.body.Bytes())
	case err == nil:
		outcome, status = "replay", out.Status
		h := out.Header.Clone()
		if h == nil {
			h = make(http.Header)
		}
		h.Set(m.cfg.ReplayedHeader, "true")
		writeResponse(w, out.Status, h, out.Body)
	case errors.Is(err, errNotStorable):
		outcome, status = "run", last.status
		writeResponse(w, last.status, last.sent, last.body.Bytes())
	case errors.Is(err, errStreamed):
		outcome, status = "refused", http.StatusInternalServerError
		m.writeProblem(w, problemStreaming, 0, 0, "The handler tried to stream its response, which cannot be done under an idempotency key; nothing was stored or committed. Retry without the key, or ask the API owner.")
	case errors.Is(err, errRespTooBig):
		outcome, status = "refused", http.StatusInternalServerError
		m.writeProblem(w, problemTooLarge, 0, 0, fmt.Sprintf("The response was larger than %d bytes, too large to store; nothing was committed. This is a server limit.", m.cfg.MaxResponseBytes))
	case errors.As(err, &inFlight):
		outcome, status = "in_flight", http.StatusConflict
		if inFlight.Race {
			// Each attempt lost the race to a duplicate that committed after it looked: the
			// client sees a 409 and retries, but this should not happen on every attempt.
			m.cfg.Logger.WarnContext(r.Context(), "idemhttp: a race for the key survived every retry of the transaction", "scope", key.Scope,
				m.cfg.keys.Log(rk), m.cfg.keys.Error(err, rk))
		}
		m.writeProblem(w, problemInFlight, 0, max(inFlight.RetryAfter, 1), "A request with this idempotency key is still being processed. Retry after the time in Retry-After with the same key to get its response.")
	case errors.Is(err, idem.ErrMismatch):
		outcome, status = "mismatch", m.cfg.MismatchStatus
		m.writeProblem(w, problemMismatch, m.cfg.MismatchStatus, 0, fmt.Sprintf("This %s was already used for a different request (method, path, query, content type or body differ). Use a new key for a new request.", m.cfg.KeyHeader))
	case abortedTx(err) && last != nil && last.status >= 400 && last.status < 500:
		// The handler turned a failed statement into a client error (a unique violation into
		// 409, say). The failed transaction cannot store it; send it unstored, like a 5xx.
		outcome, status = "run", last.status
		writeResponse(w, last.status, last.sent, last.body.Bytes())
	case abortedTx(err):
		outcome, status = "error", http.StatusInternalServerError
		m.cfg.Logger.ErrorContext(r.Context(), "idemhttp: handler answered success after a statement in its transaction failed; nothing was committed", "scope", key.Scope,
			m.cfg.keys.Log(rk), m.cfg.keys.Error(err, rk))
		m.writeProblem(w, problemHandlerTx, 0, 0, "The server's handler reported success but its database transaction had failed, so nothing was committed. Retry with the same key.")
	default:
		outcome, status = "unavailable", http.StatusServiceUnavailable
		if r.Context().Err() == nil {
			m.cfg.Logger.WarnContext(r.Context(), "idemhttp: the idempotency store is unavailable; the request was refused with 503", "scope", key.Scope,
				m.cfg.keys.Log(rk), m.cfg.keys.Error(err, rk))
		}
		m.writeProblem(w, problemUnavailable, 0, m.cfg.UnavailableRetryAfter, "The server could not record this request in its idempotency store, so it did not complete it. Retry after the time in Retry-After with the same key.")
	}
}

// runHandler runs the handler once, into a fresh buffer, with t reachable through Tx. The error
// is the retryable one a statement reported, if any (see package internal/txwatch).
func (m *middleware) runHandler(ctx context.Context, t pgx.Tx, w http.ResponseWriter, r *http.Request, next http.Handler, rt route, key idem.Key, body []byte) (*recorder, error) {
	rec := newRecorder(w, m.cfg.MaxResponseBytes)
	wt := txwatch.New(t, errOwnedByMiddleware)
	r2 := r.WithContext(context.WithValue(ctx, ctxKey{}, &guardState{m: m, rc: rt.rc, tx: wt, key: key}))
	// Each attempt reads the body from the start.
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	next.ServeHTTP(rec, r2)
	rec.finish()
	return rec, wt.Retryable()
}

// abortedTx reports a statement refused because an earlier one in the transaction failed.
func abortedTx(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25P02"
}

var errOwnedByMiddleware = errors.New("idemhttp: the middleware commits or rolls back the transaction from Tx when the handler returns; answer with a 5xx to roll back")
