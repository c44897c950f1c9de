// Package idemhttp makes HTTP requests safe to retry, with the semantics of the IETF
// Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header) and Stripe's API: a server
// [Middleware] that runs each keyed request at most once and replays its response to every retry,
// and a client [Transport] that keys requests and retries them until it gets that response.
//
// Server:
//
//	mw, err := idemhttp.Middleware(pool, &idemhttp.Config{
//		Scope: func(r *http.Request) string { return "user:" + userID(r.Context()) },
//	})
//	if err != nil {
//		return err
//	}
//	mux.Handle("POST /orders", mw(http.HandlerFunc(createOrder)))
//
// The handler writes through [Tx], the transaction that holds the key: its rows and River jobs
// commit with the stored response, or not at all. [Key] tells it the key the middleware used.
//
// A stored response is kept whole, every header but the ones left out and the whole body, for
// Config.TTL, and replayed to anyone who sends its key in its scope. A secret shown once (an API
// key at creation) is stored and replayed with it unless a [Redactor] takes it out.
//
// Client:
//
//	client := &http.Client{Transport: &idemhttp.Transport{}}
//	resp, err := client.Post(url, "application/json", strings.NewReader(body))
//
// Other retrying clients work too once they retry a 409 after its Retry-After, which generic
// policies do not: with go-retryablehttp, set its CheckRetry to [RetryPolicy] and its Backoff to
// [RetryBackoff], and send the same Idempotency-Key on every attempt.
//
// # Routers
//
// The middleware is a func(http.Handler) http.Handler: net/http and chi take it as it is
// (chi's Use or With). In gin, wrap it with the idemgin module's
// Middleware (github.com/idemkit/idem/idemhttp/idemgin). In echo (v4), echo.WrapMiddleware
// works only for handlers that write their errors themselves: a handler that returns an error
// is answered by echo's HTTPErrorHandler after the whole chain has returned, that is after the
// middleware stored and sent an empty 200. Write the error inside instead:
//
//	func idemEcho(mw func(http.Handler) http.Handler) echo.MiddlewareFunc {
//		return func(next echo.HandlerFunc) echo.HandlerFunc {
//			return func(c echo.Context) error {
//				mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//					c.SetRequest(r)
//					c.SetResponse(echo.NewResponse(w, c.Echo()))
//					if err := next(c); err != nil {
//						c.Error(err) // answered inside: stored (4xx) or rolled back (5xx)
//					}
//				})).ServeHTTP(c.Response(), c.Request())
//				return nil
//			}
//		}
//	}
//
// # Problems
//
// Errors the middleware answers itself are RFC 9457 problem documents; their type is
// [DefaultProblemTypeBase] (or Config.ProblemTypeBase) followed by one of these names:
//
//   - idempotency-key-missing (400): the route requires a key and the request has none.
//   - idempotency-key-invalid (400): the key is malformed, or sent more than once.
//   - idempotency-scope-missing (400): Config.Scope found no identity for a keyed request.
//   - idempotency-scope-ambiguous (400): the header [HeaderScope] reads was sent more than once.
//   - request-body-unreadable (400): the body could not be read.
//   - request-body-too-large (413): the body is over Config.MaxBodyBytes; nothing ran.
//   - idempotency-key-in-flight (409): another request with the key is running; retry after
//     Retry-After.
//   - idempotency-key-reused (422, or 400): the key was used for a different request.
//   - streaming-response-refused (500): the handler flushed; nothing was committed.
//   - response-too-large (500): the response is over Config.MaxResponseBytes; nothing was
//     committed.
//   - handler-transaction-failed (500): the handler answered success from a failed transaction.
//   - idempotency-misconfigured (500): a server configuration error; nothing ran.
//   - idempotency-store-unavailable (503): Postgres failed; retry after Retry-After.
//
// # Keys in records
//
// The middleware's spans and log records, and idem.Do's inside them, never carry the value of a
// request's Idempotency-Key, not even in the error texts they record: a client may reuse a
// secret as its key. They carry the key's hash instead (idem.key.hash, key_hash), which idem
// keys get prints; Config.RecordKeys puts the value itself in.
package idemhttp
