package idemgrpc

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrorDomain is the Domain of the ErrorInfo detail on every error the server interceptor
// answers with itself, as opposed to an error of the handler or a replay of one. Its Reason is
// one of the Reason constants, so clients can tell the cases apart without parsing messages.
//
//	st := status.Convert(err)
//	for _, d := range st.Details() {
//		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == idemgrpc.ErrorDomain {
//			log.Printf("idempotency: %s", info.Reason)
//		}
//	}
const ErrorDomain = "github.com/idemkit/idem/idemgrpc"

// Reasons of the errors the server interceptor answers with, and their codes.
//
//	if idemgrpc.Reason(err) == idemgrpc.ReasonKeyInFlight { ... } // retry later with the same key
const (
	ReasonKeyMissing       = "IDEMPOTENCY_KEY_MISSING"       // InvalidArgument: RequireKey, and the call has no key
	ReasonKeyInvalid       = "IDEMPOTENCY_KEY_INVALID"       // InvalidArgument: malformed key, or more than one
	ReasonScopeMissing     = "IDEMPOTENCY_SCOPE_MISSING"     // InvalidArgument: Config.Scope found no identity
	ReasonKeyInFlight      = "IDEMPOTENCY_KEY_IN_FLIGHT"     // Aborted + RetryInfo: another call with the key is running
	ReasonKeyReused        = "IDEMPOTENCY_KEY_REUSED"        // FailedPrecondition: the key was used for another request
	ReasonResponseTooLarge = "RESPONSE_TOO_LARGE"            // Internal: over Config.MaxResponseBytes; rolled back
	ReasonHandlerTxFailed  = "HANDLER_TRANSACTION_FAILED"    // Internal: the handler answered from a failed transaction
	ReasonMisconfigured    = "IDEMPOTENCY_MISCONFIGURED"     // Internal: a server configuration or handler bug
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE" // Unavailable + RetryInfo: Postgres failed
)

// Reason returns the Reason of err's ErrorInfo detail when err is an error the server
// interceptor answered with itself, and "" for any other error (the handler's, a replayed one,
// or a transport failure).
//
//	_, err := client.Transfer(ctx, req)
//	switch idemgrpc.Reason(err) {
//	case idemgrpc.ReasonKeyReused:
//		// a bug in the client: a new request needs a new key
//	}
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == ErrorDomain {
			return info.Reason
		}
	}
	return ""
}

// refusal builds an error the interceptor answers with: code and message, an ErrorInfo with
// reason, and a RetryInfo when retryAfter > 0.
func refusal(code codes.Code, reason string, retryAfter time.Duration, msg string) error {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil { // only for codes.OK, which no caller passes
		return status.Error(code, msg)
	}
	return st.Err()
}

// retryDelay returns the delay of st's RetryInfo detail, if it has one.
func retryDelay(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if err := ri.GetRetryDelay().CheckValid(); err != nil {
				return 0, false
			}
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}

// neverStored are the codes that ask the client to retry: an error with one of them describes
// the attempt, not the request, so it is rolled back and a retry runs afresh. Canceled is among
// them too: it is the caller's (or a dependency's) giving up, not an answer to the request.
func neverStored(code codes.Code) bool {
	switch code {
	case codes.Unavailable, codes.Internal, codes.Unknown, codes.DeadlineExceeded,
		codes.Aborted, codes.ResourceExhausted, codes.Canceled:
		return true
	}
	return false
}
