// Package idemgrpc makes gRPC calls safe to retry, with the guarantees of package idem: a server
// [UnaryServerInterceptor] that runs each keyed call of a guarded method at most once and
// replays its answer to every retry, and a client [UnaryClientInterceptor] that keys calls and
// retries them until it gets that answer. The key travels in the idempotency-key metadata.
//
// Server:
//
//	intercept, err := idemgrpc.UnaryServerInterceptor(pool, &idemgrpc.Config{
//		Scope:   func(ctx context.Context) string { return "user:" + userID(ctx) },
//		Methods: []string{"/bank.v1.Bank/Transfer"},
//	})
//	if err != nil {
//		return err
//	}
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, intercept))
//
// The handler writes through [Tx], the transaction that holds the key: its rows and River jobs
// commit with the stored answer, or not at all.
//
// Client:
//
//	intercept, err := idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientConfig{
//		Methods: []string{"/bank.v1.Bank/Transfer"},
//	})
//	conn, err := grpc.NewClient(target, creds, grpc.WithChainUnaryInterceptor(intercept))
//
// # Status codes
//
// The server interceptor answers with these codes itself, each with an ErrorInfo detail whose
// Reason is one of the Reason constants:
//
//   - InvalidArgument: the key is missing where required, malformed or sent more than once, or
//     Config.Scope found no identity for a keyed call. Nothing ran.
//   - Aborted, with RetryInfo: another call with the key is running; retry after the delay.
//   - FailedPrecondition: the key was used for a different request. Nothing ran; use a new key.
//   - Internal: the answer is too large to store, the handler answered from a failed
//     transaction, or the server is misconfigured. Nothing was committed.
//   - Unavailable, with RetryInfo: Postgres failed; the interceptor fails closed. Retry.
//
// The interceptor's log records, and idem.Do's spans for the guarded calls, never carry a call's
// key, not even in the error texts they record; they carry its hash (idem.key.hash, key_hash)
// unless Config.RecordKeys is set.
//
// It is its own module, so that depending on package idem does not pull in gRPC.
package idemgrpc
