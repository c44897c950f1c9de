package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/txwatch"
	"github.com/idemkit/idem/tx"
)

// UnaryServerInterceptor returns a gRPC unary server interceptor that makes the methods it
// guards safe to retry: a call carrying an idempotency key in its metadata runs its handler at
// most once per key and scope, and every retry gets the first answer back. Install it with
// grpc.ChainUnaryInterceptor after the interceptors that authenticate: Config.Scope reads their
// result. A recovery interceptor may sit on either side of it: inside, it turns a panic into an
// error that is not stored (Internal); outside, it sees the panic after the transaction has been
// rolled back.
//
// For a call of a guarded method (Config.Methods) with a key, the interceptor validates the key,
// finds the scope (Config.Scope) and fingerprints the call: the full method name and the
// deterministic encoding of the request ([DefaultFingerprint]). Then, in a transaction run by
// [tx.Run], it calls [idem.Do] around the handler. The handler reaches the transaction through
// [Tx]: what it writes there (rows, River jobs inserted with InsertTx) commits together with its
// stored answer, or not at all. Metadata the handler sets with grpc.SetHeader, grpc.SendHeader
// and grpc.SetTrailer is recorded, not sent, and the answer is returned only after the commit.
// Because nothing has left the process before the commit, tx.Run can run the handler again when
// Postgres aborts the transaction with a serialization failure or deadlock, or when a concurrent
// duplicate wins a race (the rerun then replays).
//
// Outcomes, and what the client gets:
//
//	handler returns a response              the response; stored; later: replayed + idempotent-replayed: true
//	handler returns an error (other codes)  the error; stored with its details and replayed (Config.Store)
//	handler returns Unavailable, Internal,  the error, not stored; the transaction rolls back, a retry
//	  Unknown, DeadlineExceeded, Aborted,     runs afresh
//	  ResourceExhausted or Canceled
//	handler panics                          the transaction rolls back, then the panic continues
//	key in use by a call in progress        Aborted + RetryInfo (IDEMPOTENCY_KEY_IN_FLIGHT)
//	key used for a different request        FailedPrecondition (IDEMPOTENCY_KEY_REUSED)
//	key malformed, or sent more than once   InvalidArgument (IDEMPOTENCY_KEY_INVALID)
//	no key, with Config.RequireKey          InvalidArgument (IDEMPOTENCY_KEY_MISSING)
//	no identity (Config.Scope returned "")  InvalidArgument (IDEMPOTENCY_SCOPE_MISSING)
//	answer over Config.MaxResponseBytes     Internal, rolled back (RESPONSE_TOO_LARGE)
//	handler answered from a failed tx       Internal, rolled back (HANDLER_TRANSACTION_FAILED)
//	Postgres unreachable or failing         Unavailable + RetryInfo (IDEMPOTENCY_STORE_UNAVAILABLE)
//
// Errors the interceptor answers with itself carry an ErrorInfo detail in [ErrorDomain] with
// one of the Reason constants (see [Reason]). A key reused for a different request is
// FailedPrecondition rather than InvalidArgument or AlreadyExists: the request is valid on its
// own and only conflicts with what the server holds for the key; it is not an entity that
// already exists (a client may take AlreadyExists for success); and like every
// FailedPrecondition it must not be retried as it is: the client needs a new key.
//
// On a replay, the stored message, or error with its details, comes back decoded from the same
// bytes as the first answer (so they are proto.Equal), with the header and trailer metadata the
// handler set, less those that belong to one response or connection (see Config.DropMetadata),
// and with the header idempotent-replayed: true. Calls without a key (where not required) and
// calls of other methods pass through untouched: no transaction is begun.
//
//	intercept, err := idemgrpc.UnaryServerInterceptor(pool, &idemgrpc.Config{
//		Scope:   func(ctx context.Context) string { return "user:" + userID(ctx) },
//		Methods: []string{"/bank.v1.Bank/Transfer"},
//	})
//	if err != nil {
//		return err
//	}
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, intercept))
func UnaryServerInterceptor(db tx.Beginner, cfg *Config) (grpc.UnaryServerInterceptor, error) {
	if db == nil {
		return nil, errors.New("idemgrpc: db cannot be nil: pass the *pgxpool.Pool that holds idem's tables")
	}
	s, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	srv := &server{db: db, cfg: s}
	return srv.intercept, nil
}

type server struct {
	db  tx.Beginner
	cfg *settings
}

type ctxKey struct{}

// Tx returns the transaction of the guarded call ctx belongs to: the one that holds the
// idempotency key and commits with the stored answer. Write through it, and insert River jobs
// with InsertTx on it (the transactional outbox), so that the effects commit exactly when the
// answer is stored. ok is false when the call is not guarded (no key, or a method the
// interceptor does not guard); the handler then has to use a transaction of its own.
//
// The interceptor commits or rolls back: the transaction's Commit and Rollback return an error.
// Savepoints (Begin) work as usual. Return an error with a code that is not stored (Internal,
// say) to roll back.
//
//	func (s *bank) Transfer(ctx context.Context, req *bankpb.TransferRequest) (*bankpb.TransferReply, error) {
//		t, ok := idemgrpc.Tx(ctx)
//		if !ok {
//			return nil, status.Error(codes.InvalidArgument, "send an idempotency-key")
//		}
//		var id int64
//		err := t.QueryRow(ctx, `INSERT INTO transfers (amount) VALUES ($1) RETURNING id`, req.Amount).Scan(&id)
//		if err != nil {
//			return nil, status.Error(codes.Internal, "database error") // not stored: rolled back
//		}
//		return &bankpb.TransferReply{Id: id}, nil
//	}
func Tx(ctx context.Context) (pgx.Tx, bool) {
	t, ok := ctx.Value(ctxKey{}).(pgx.Tx)
	return t, ok && t != nil
}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m, ok := s.cfg.methods[info.FullMethod]
	if !ok {
		return handler(ctx, req)
	}
	values := metadata.ValueFromIncomingContext(ctx, s.cfg.KeyMetadata)
	switch {
	case len(values) == 0 && s.cfg.RequireKey:
		return nil, refusal(codes.InvalidArgument, ReasonKeyMissing, 0, fmt.Sprintf("%s requires %s metadata: send a unique value, such as a UUID, and reuse it on every retry of this call", info.FullMethod, s.cfg.KeyMetadata))
	case len(values) == 0:
		return handler(ctx, req)
	case len(values) > 1:
		return nil, refusal(codes.InvalidArgument, ReasonKeyInvalid, 0, fmt.Sprintf("the call has %d %s values; send exactly one", len(values), s.cfg.KeyMetadata))
	}
	if err := idem.ValidateID(values[0]); err != nil {
		reason := err.Error()
		var bad *idem.InvalidKeyError
		if errors.As(err, &bad) {
			reason = bad.Reason
		}
		return nil, refusal(codes.InvalidArgument, ReasonKeyInvalid, 0, fmt.Sprintf("the %s metadata is not valid (%s): send 1 to 255 printable ASCII characters without spaces, such as a UUID", s.cfg.KeyMetadata, reason))
	}
	key := idem.Key{Scope: s.cfg.Scope(ctx), ID: values[0]}
	if key.Scope == "" {
		return nil, refusal(codes.InvalidArgument, ReasonScopeMissing, 0, fmt.Sprintf("the call carries %s metadata but no identity to keep the key under: authenticate the call, or send it without the key", s.cfg.KeyMetadata))
	}
	if err := key.Validate(); err != nil {
		s.cfg.Logger.ErrorContext(ctx, "idemgrpc: Config.Scope returned an invalid scope; hash long identities", "method", info.FullMethod, "error", err)
		return nil, refusal(codes.Internal, ReasonMisconfigured, 0, "the server could not derive a valid scope for this call; this is a server bug, and the call did not run")
	}
	msg, ok := req.(proto.Message)
	if !ok {
		s.cfg.Logger.ErrorContext(ctx, "idemgrpc: the request is not a protobuf message; guard only methods served with the protobuf codec", "method", info.FullMethod, "type", fmt.Sprintf("%T", req))
		return nil, refusal(codes.Internal, ReasonMisconfigured, 0, "the server cannot fingerprint this call; this is a server bug, and the call did not run")
	}
	fp, err := s.cfg.Fingerprint(info.FullMethod, msg)
	if err != nil {
		s.cfg.Logger.ErrorContext(ctx, "idemgrpc: error fingerprinting a call", "method", info.FullMethod, "error", err)
		return nil, refusal(codes.Internal, ReasonMisconfigured, 0, "the server could not fingerprint this call; the call did not run")
	}
	key.Fingerprint = fp
	return s.guard(ctx, m, msg, handler, key)
}

// outcome is what the handler answered in one attempt.
type outcome struct {
	reply   proto.Message // nil when err is set
	err     error
	header  metadata.MD
	trailer metadata.MD
}

func (s *server) guard(ctx context.Context, m *method, req proto.Message, handler grpc.UnaryHandler, key idem.Key) (any, error) {
	rk := redact.Key{Scope: key.Scope, ID: key.ID}
	var (
		out   storedReply
		fresh *outcome // the handler's answer, when this call's attempt stored it
		last  *outcome // the handler's answer in the last attempt, stored or not
	)
	err := tx.Run(ctx, s.db, func(ctx context.Context, t pgx.Tx) error {
		fresh, last = nil, nil
		var err error
		out, err = idem.Do(ctx, t, key, func(ctx context.Context, t pgx.Tx) (storedReply, error) {
			o, err := s.runHandler(ctx, t, m, req, handler)
			last = o
			if err != nil {
				return storedReply{}, err // retryable: tx.Run runs the handler again
			}
			rec, err := s.cfg.storable(m, o)
			if err != nil {
				return storedReply{}, err
			}
			fresh = o
			return rec, nil
		}, s.cfg.keyOpts...)
		return err
	}, s.cfg.txOpts...)

	var (
		inFlight *idem.InFlightError
		refused  *answerError
	)
	switch {
	case err == nil:
		return s.answer(ctx, m, out, fresh)
	case errors.Is(err, errNotStored):
		return s.forward(ctx, last)
	case errors.As(err, &refused):
		if refused.reason == ReasonMisconfigured {
			s.cfg.Logger.ErrorContext(ctx, "idemgrpc: the handler's answer cannot be stored; nothing was committed", "method", m.name, "scope", key.Scope,
				s.cfg.keys.Log(rk), s.cfg.keys.Error(err, rk))
		}
		return nil, refusal(refused.code, refused.reason, 0, refused.msg)
	case errors.As(err, &inFlight):
		return nil, refusal(codes.Aborted, ReasonKeyInFlight, max(inFlight.RetryAfter, time.Second), fmt.Sprintf("a call with this %s is still being processed: retry after the delay in RetryInfo with the same key to get its answer", s.cfg.KeyMetadata))
	case errors.Is(err, idem.ErrMismatch):
		return nil, refusal(codes.FailedPrecondition, ReasonKeyReused, 0, fmt.Sprintf("this %s was already used for a different request (another method, or another request message): use a new key for a new request", s.cfg.KeyMetadata))
	case abortedTx(err) && last != nil && last.err != nil && !neverStored(status.Code(last.err)):
		// The handler turned a failed statement into an answer (a unique violation into
		// AlreadyExists, say). The failed transaction cannot store it; send it unstored.
		return s.forward(ctx, last)
	case abortedTx(err):
		s.cfg.Logger.ErrorContext(ctx, "idemgrpc: the handler answered after a statement in its transaction failed; nothing was committed", "method", m.name,
			"scope", key.Scope, s.cfg.keys.Log(rk), s.cfg.keys.Error(err, rk))
		return nil, refusal(codes.Internal, ReasonHandlerTxFailed, 0, "the server's handler answered, but its database transaction had failed, so nothing was committed; retry with the same key")
	case ctx.Err() != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	default:
		s.cfg.Logger.ErrorContext(ctx, "idemgrpc: error running guarded call", "method", m.name, "scope", key.Scope, s.cfg.keys.Log(rk), s.cfg.keys.Error(err, rk))
		return nil, refusal(codes.Unavailable, ReasonStoreUnavailable, s.cfg.UnavailableRetryDelay, "the server could not record this call in its idempotency store, so it did not complete it: retry after the delay in RetryInfo with the same key")
	}
}

// runHandler runs the handler once, recording its metadata, with t reachable through Tx. The
// error is the retryable one a statement reported, if any (see package internal/txwatch).
func (s *server) runHandler(ctx context.Context, t pgx.Tx, m *method, req proto.Message, handler grpc.UnaryHandler) (*outcome, error) {
	stream := &recordingStream{method: m.name}
	wt := txwatch.New(t, errOwnedByInterceptor)
	hctx := grpc.NewContextWithServerTransportStream(context.WithValue(ctx, ctxKey{}, pgx.Tx(wt)), stream)
	// Each attempt gets its own copy: a handler that changes its request must not change the
	// next attempt's.
	reply, err := handler(hctx, proto.Clone(req))
	o := &outcome{err: err}
	o.header, o.trailer = stream.recorded()
	if err == nil {
		o.reply, _ = reply.(proto.Message)
	}
	return o, wt.Retryable()
}

// answer sends a committed answer: the handler's metadata on the first answer, the stored
// metadata and the replayed mark on a replay; the message or error decoded from the store.
func (s *server) answer(ctx context.Context, m *method, out storedReply, fresh *outcome) (any, error) {
	reply, sp, err := rebuild(m, out)
	if err != nil {
		s.cfg.Logger.ErrorContext(ctx, "idemgrpc: the stored answer cannot be replayed", "method", m.name, "error", err)
		return nil, refusal(codes.Internal, ReasonMisconfigured, 0, "the server cannot replay the answer it stored for this key; this is a server bug")
	}
	var header, trailer metadata.MD
	if fresh != nil {
		header, trailer = fresh.header, fresh.trailer
		delete(header, s.cfg.ReplayedMetadata) // the first answer is not a replay, whatever the handler says
	} else {
		header, trailer = out.Header.metadata(), out.Trailer.metadata()
		header.Set(s.cfg.ReplayedMetadata, "true")
	}
	s.sendMetadata(ctx, header, trailer)
	if sp != nil {
		return nil, status.ErrorProto(sp)
	}
	return reply, nil
}

// forward sends an answer that was not stored as the handler gave it.
func (s *server) forward(ctx context.Context, o *outcome) (any, error) {
	s.sendMetadata(ctx, o.header, o.trailer)
	if o.err != nil {
		return nil, o.err
	}
	return o.reply, nil
}

func (s *server) sendMetadata(ctx context.Context, header, trailer metadata.MD) {
	if len(header) > 0 {
		if err := grpc.SetHeader(ctx, header); err != nil {
			s.cfg.Logger.WarnContext(ctx, "idemgrpc: error setting response header", "error", err)
		}
	}
	if len(trailer) > 0 {
		if err := grpc.SetTrailer(ctx, trailer); err != nil {
			s.cfg.Logger.WarnContext(ctx, "idemgrpc: error setting response trailer", "error", err)
		}
	}
}

// abortedTx reports a statement refused because an earlier one in the transaction failed.
func abortedTx(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25P02"
}

var errOwnedByInterceptor = errors.New("idemgrpc: the interceptor commits or rolls back the transaction from Tx when the handler returns; return an error to roll back")
