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
// commit with the stored response, or not at all.
//
// Client:
//
//	client := &http.Client{Transport: &idemhttp.Transport{}}
//	resp, err := client.Post(url, "application/json", strings.NewReader(body))
//
// # Problems
//
// Errors the middleware answers itself are RFC 9457 problem documents; their type is
// [DefaultProblemTypeBase] (or Config.ProblemTypeBase) followed by one of these names:
//
//   - idempotency-key-missing (400): the route requires a key and the request has none.
//   - idempotency-key-invalid (400): the key is malformed, or sent more than once.
//   - idempotency-scope-missing (400): Config.Scope found no identity for a keyed request.
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
package idemhttp
