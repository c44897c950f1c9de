package idemgrpc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/internal/testpb"
)

func TestServer(t *testing.T) {
	t.Parallel()

	t.Run("ReplayIsTheFirstAnswer", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{})

		var h1, tr1, h2, tr2 metadata.MD
		first, err := c.Record(keyed(b.ctx, "k1"), request("once"), grpc.Header(&h1), grpc.Trailer(&tr1))
		require.NoError(t, err)
		require.Empty(t, h1.Get("idempotent-replayed"))
		require.EqualValues(t, 1, first.GetId())

		again, err := c.Record(keyed(b.ctx, "k1"), request("once"), grpc.Header(&h2), grpc.Trailer(&tr2))
		require.NoError(t, err)
		require.True(t, proto.Equal(first, again), "replay %v differs from first answer %v", again, first)
		require.Equal(t, []string{"true"}, h2.Get("idempotent-replayed"))
		for _, k := range []string{"x-effect-id", "x-blob-bin"} {
			require.NotEmpty(t, h1.Get(k), k)
			require.Equal(t, h1.Get(k), h2.Get(k), k)
		}
		require.Equal(t, []string{"\x00\xff\xfe"}, h2.Get("x-blob-bin"), "binary metadata survives storage")
		require.Equal(t, []string{"c-1"}, tr2.Get("x-checksum"))
		require.Equal(t, tr1.Get("x-checksum"), tr2.Get("x-checksum"))

		require.EqualValues(t, 1, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
		require.Equal(t, 1, b.storedKeys(t))
	})

	t.Run("StoredErrorReplaysWithDetails", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			b.runs.Add(1)
			tx, _ := idemgrpc.Tx(ctx)
			// The decline is recorded, and commits with the stored answer.
			if _, err := tx.Exec(ctx, `INSERT INTO effects (note) VALUES ('declined')`); err != nil {
				return nil, err
			}
			_ = grpc.SetHeader(ctx, metadata.Pairs("x-decline", "funds"))
			st, err := status.New(codes.FailedPrecondition, "insufficient funds").WithDetails(
				&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{Type: "FUNDS", Subject: req.GetAccount(), Description: "balance 10 < 250"}}},
				&errdetails.LocalizedMessage{Locale: "en-GB", Message: "Not enough money"},
			)
			require.NoError(t, err)
			return nil, st.Err()
		}})

		var h1, h2 metadata.MD
		_, err1 := c.Record(keyed(b.ctx, "k1"), request("x"), grpc.Header(&h1))
		_, err2 := c.Record(keyed(b.ctx, "k1"), request("x"), grpc.Header(&h2))
		st1, st2 := status.Convert(err1), status.Convert(err2)
		require.Equal(t, codes.FailedPrecondition, st1.Code())
		require.Len(t, st1.Details(), 2)
		require.True(t, proto.Equal(st1.Proto(), st2.Proto()), "replay %v differs from first answer %v", st2.Proto(), st1.Proto())
		require.Empty(t, h1.Get("idempotent-replayed"))
		require.Equal(t, []string{"true"}, h2.Get("idempotent-replayed"))
		require.Equal(t, []string{"funds"}, h2.Get("x-decline"))
		require.EqualValues(t, 1, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
	})

	t.Run("RetryableCodesRollBack", func(t *testing.T) {
		t.Parallel()
		for _, code := range []codes.Code{codes.Unavailable, codes.Internal, codes.Unknown, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted, codes.Canceled} {
			t.Run(code.String(), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				c := b.serve(t, serveOpts{record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
					if _, err := b.record(ctx, req); err != nil {
						return nil, err
					}
					_ = grpc.SetHeader(ctx, metadata.Pairs("x-attempt", "yes"))
					return nil, status.Error(code, "try again")
				}})
				for range 2 {
					var h metadata.MD
					_, err := c.Record(keyed(b.ctx, "k1"), request("n"), grpc.Header(&h))
					require.Equal(t, code, status.Code(err))
					require.Equal(t, "try again", status.Convert(err).Message())
					require.Equal(t, []string{"yes"}, h.Get("x-attempt"), "the handler's metadata is forwarded")
					require.Empty(t, h.Get("idempotent-replayed"))
				}
				require.EqualValues(t, 2, b.runs.Load(), "nothing stored: each call runs")
				require.Zero(t, b.effects(t))
				require.Zero(t, b.storedKeys(t))
			})
		}
	})

	t.Run("StoreDecides", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := config()
		cfg.Store = func(code codes.Code) bool { return code != codes.NotFound }
		c := b.serve(t, serveOpts{cfg: cfg, record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			b.runs.Add(1)
			return nil, status.Error(codes.NotFound, "no account")
		}})
		for range 2 {
			_, err := c.Record(keyed(b.ctx, "k1"), request("n"))
			require.Equal(t, codes.NotFound, status.Code(err))
		}
		require.EqualValues(t, 2, b.runs.Load())
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("InFlightIsAbortedWithRetryInfo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		entered, release := make(chan struct{}), make(chan struct{})
		c := b.serve(t, serveOpts{record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			if b.runs.Load() == 0 {
				close(entered)
				<-release
			}
			return b.record(ctx, req)
		}})
		firstDone := make(chan error, 1)
		go func() {
			_, err := c.Record(keyed(b.ctx, "k1"), request("n"))
			firstDone <- err
		}()
		<-entered
		_, err := c.Record(keyed(b.ctx, "k1"), request("n"))
		st := refused(t, err, codes.Aborted, idemgrpc.ReasonKeyInFlight)
		var delay *durationpb.Duration
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				delay = ri.GetRetryDelay()
			}
		}
		require.NotNil(t, delay, "Aborted carries RetryInfo")
		require.Equal(t, time.Second, delay.AsDuration(), "idem's default retry-after")
		close(release)
		require.NoError(t, <-firstDone)
		require.EqualValues(t, 1, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
	})

	t.Run("OtherRequestUnderTheKeyIsFailedPrecondition", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := config()
		cfg.Methods = []string{"/idemgrpc.test.v1.Ledger/*"}
		cfg.ExceptMethods = []string{followMethod}
		c := b.serve(t, serveOpts{cfg: cfg})
		_, err := c.Record(keyed(b.ctx, "k1"), request("a"))
		require.NoError(t, err)

		_, err = c.Record(keyed(b.ctx, "k1"), request("b"))
		refused(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
		// The same key on another guarded method is another request too.
		_, err = c.Lookup(keyed(b.ctx, "k1"), &testpb.LookupRequest{Id: 1})
		refused(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)

		// Equal requests match however the client ordered the map's entries; another user's
		// key of the same name is another key.
		_, err = c.Record(keyed(b.ctx, "k1"), request("a"))
		require.NoError(t, err)
		bob := metadata.AppendToOutgoingContext(b.ctx, "x-user", "bob", "idempotency-key", "k1")
		_, err = c.Record(bob, request("b"))
		require.NoError(t, err)
		require.EqualValues(t, 2, b.runs.Load())
		require.Equal(t, 2, b.effects(t))
	})

	t.Run("InvalidKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{})
		long := strings.Repeat("k", 100_000)
		for name, md := range map[string]metadata.MD{
			"Empty":     metadata.Pairs("x-user", "alice", "idempotency-key", ""),
			"TooLong":   metadata.Pairs("x-user", "alice", "idempotency-key", long),
			"Space":     metadata.Pairs("x-user", "alice", "idempotency-key", "two words"),
			"TwoValues": metadata.Pairs("x-user", "alice", "idempotency-key", "k1", "idempotency-key", "k2"),
		} {
			_, err := c.Record(metadata.NewOutgoingContext(b.ctx, md), request("n"))
			st := refused(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
			require.Less(t, len(st.Message()), 300, "%s: the message is bounded: %s", name, st.Message())
			require.NotContains(t, st.Message(), "kkkkkkkk", name)
		}
		require.Zero(t, b.runs.Load())
	})

	t.Run("KeyWithoutScopeIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{})
		_, err := c.Record(metadata.AppendToOutgoingContext(b.ctx, "idempotency-key", "k1"), request("n"))
		refused(t, err, codes.InvalidArgument, idemgrpc.ReasonScopeMissing)
		require.Zero(t, b.runs.Load())
	})

	t.Run("NoKeyPassesThroughUnlessRequired", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{})
		_, err := c.Record(keyed(b.ctx, ""), request("n"))
		require.Equal(t, codes.FailedPrecondition, status.Code(err))
		require.Equal(t, "not guarded", status.Convert(err).Message(), "the handler ran without a transaction")
		require.EqualValues(t, 1, b.runs.Load())

		cfg := config()
		cfg.RequireKey = true
		c = b.serve(t, serveOpts{cfg: cfg})
		_, err = c.Record(keyed(b.ctx, ""), request("n"))
		refused(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyMissing)
		require.EqualValues(t, 1, b.runs.Load())
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("OtherMethodsPassThrough", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{})
		out, err := c.Lookup(keyed(b.ctx, "k1"), &testpb.LookupRequest{Id: 7})
		require.NoError(t, err)
		require.Equal(t, "false", out.GetNote(), "Lookup is not guarded: no transaction")
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("PanicRollsBackAndContinues", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		recovered := make(chan any, 1)
		recoverer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer func() {
				if p := recover(); p != nil {
					recovered <- p
					err = status.Error(codes.Internal, "panic")
				}
			}()
			return h(ctx, req)
		}
		c := b.serve(t, serveOpts{outer: []grpc.UnaryServerInterceptor{recoverer}, record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			out, err := b.record(ctx, req)
			if b.runs.Load() == 1 {
				panic("boom")
			}
			return out, err
		}})
		_, err := c.Record(keyed(b.ctx, "k1"), request("n"))
		require.Equal(t, codes.Internal, status.Code(err))
		require.Equal(t, "boom", <-recovered, "the panic went on past the interceptor")
		require.Zero(t, b.effects(t))
		require.Zero(t, b.storedKeys(t))

		out, err := c.Record(keyed(b.ctx, "k1"), request("n"))
		require.NoError(t, err, "the key was released")
		require.EqualValues(t, 2, out.GetId(), "the first effect's id was rolled back with it")
		require.Equal(t, 1, b.effects(t))
	})

	t.Run("SwallowedFailureIsNotStoredAsSuccess", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			out, err := b.record(ctx, req)
			tx, _ := idemgrpc.Tx(ctx)
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // failed, and ignored
			if req.GetNote() == "conflict" {
				return nil, status.Error(codes.AlreadyExists, "turned into an answer")
			}
			return out, err
		}})
		_, err := c.Record(keyed(b.ctx, "k1"), request("n"))
		refused(t, err, codes.Internal, idemgrpc.ReasonHandlerTxFailed)

		// An answer made from the failure is sent, but cannot be stored.
		for range 2 {
			_, err = c.Record(keyed(b.ctx, "k2"), request("conflict"))
			require.Equal(t, codes.AlreadyExists, status.Code(err))
			require.Equal(t, "turned into an answer", status.Convert(err).Message())
		}
		require.EqualValues(t, 3, b.runs.Load())
		require.Zero(t, b.effects(t))
		require.Zero(t, b.storedKeys(t))
	})

	t.Run("SerializationFailureRunsTheHandlerAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			out, err := b.record(ctx, req)
			if b.runs.Load() == 1 {
				tx, _ := idemgrpc.Tx(ctx)
				_, serr := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = 'serialization_failure'; END $$`)
				require.Error(t, serr)
				return nil, status.Error(codes.AlreadyExists, "a handler that misreads the failure")
			}
			return out, err
		}})
		var h metadata.MD
		out, err := c.Record(keyed(b.ctx, "k1"), request("n"), grpc.Header(&h))
		require.NoError(t, err)
		require.EqualValues(t, 2, out.GetId())
		require.Empty(t, h.Get("idempotent-replayed"))
		require.EqualValues(t, 2, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
	})

	t.Run("HandlerCannotEndTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			tx, _ := idemgrpc.Tx(ctx)
			if tx.Commit(ctx) == nil || tx.Rollback(ctx) == nil {
				return nil, status.Error(codes.FailedPrecondition, "the handler ended the transaction")
			}
			sp, err := tx.Begin(ctx) // savepoints work
			if err != nil {
				return nil, err
			}
			out, err := b.record(ctx, req)
			if err != nil {
				return nil, err
			}
			return out, sp.Commit(ctx)
		}})
		_, err := c.Record(keyed(b.ctx, "k1"), request("n"))
		require.NoError(t, err)
		require.Equal(t, 1, b.effects(t))
	})

	t.Run("NilResponseIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			if _, err := b.record(ctx, req); err != nil {
				return nil, err
			}
			return nil, nil
		}})
		_, err := c.Record(keyed(b.ctx, "k1"), request("n"))
		refused(t, err, codes.Internal, idemgrpc.ReasonMisconfigured)
		require.Zero(t, b.effects(t))
	})

	t.Run("ResponseTooLarge", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := config()
		cfg.MaxResponseBytes = 512
		c := b.serve(t, serveOpts{cfg: cfg})
		_, err := c.Record(keyed(b.ctx, "k1"), request(strings.Repeat("x", 600)))
		refused(t, err, codes.Internal, idemgrpc.ReasonResponseTooLarge)
		require.Zero(t, b.effects(t))
		_, err = c.Record(keyed(b.ctx, "k2"), request("small"))
		require.NoError(t, err)
	})

	t.Run("MetadataPolicy", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := config()
		cfg.DropMetadata = []string{"X-Request-Id"}
		headerErr := make(chan error, 1)
		c := b.serve(t, serveOpts{cfg: cfg, record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			out, err := b.record(ctx, req)
			_ = grpc.SetHeader(ctx, metadata.Pairs("x-keep", "1", "set-cookie", "session=secret", "date", "today",
				"x-request-id", "r-1", "idempotent-replayed", "true"))
			_ = grpc.SendHeader(ctx, metadata.Pairs("x-sent", "1"))
			headerErr <- grpc.SetHeader(ctx, metadata.Pairs("x-late", "1"))
			return out, err
		}})

		var h1, h2 metadata.MD
		_, err := c.Record(keyed(b.ctx, "k1"), request("n"), grpc.Header(&h1))
		require.NoError(t, err)
		require.Error(t, <-headerErr, "SetHeader after SendHeader fails, as in gRPC")
		require.Empty(t, h1.Get("idempotent-replayed"), "the first answer is not a replay, whatever the handler set")
		for _, k := range []string{"x-keep", "x-sent", "set-cookie", "x-request-id"} {
			require.NotEmpty(t, h1.Get(k), "the first answer has the handler's %s", k)
		}
		require.Empty(t, h1.Get("x-late"))

		_, err = c.Record(keyed(b.ctx, "k1"), request("n"), grpc.Header(&h2))
		require.NoError(t, err)
		require.Equal(t, []string{"true"}, h2.Get("idempotent-replayed"))
		require.Equal(t, []string{"1"}, h2.Get("x-keep"))
		require.Equal(t, []string{"1"}, h2.Get("x-sent"))
		for _, k := range []string{"set-cookie", "date", "x-request-id", "x-late"} {
			require.Empty(t, h2.Get(k), "%s is not replayed", k)
		}
	})

	t.Run("RequestChangesDoNotLeakIntoTheRerun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.serve(t, serveOpts{record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			req.Note += "!"
			out, err := b.record(ctx, req)
			if b.runs.Load() == 1 {
				tx, _ := idemgrpc.Tx(ctx)
				_, _ = tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = 'deadlock_detected'; END $$`)
			}
			return out, err
		}})
		out, err := c.Record(keyed(b.ctx, "k1"), request("n"))
		require.NoError(t, err)
		require.Equal(t, "n!", out.GetNote())
		require.EqualValues(t, 2, b.runs.Load())
	})
}

func TestReason(t *testing.T) {
	t.Parallel()
	require.Empty(t, idemgrpc.Reason(nil))
	require.Empty(t, idemgrpc.Reason(fmt.Errorf("plain")))
	require.Empty(t, idemgrpc.Reason(status.Error(codes.Aborted, "no details")))
	st, err := status.New(codes.Aborted, "other domain").WithDetails(&errdetails.ErrorInfo{Reason: idemgrpc.ReasonKeyInFlight, Domain: "example.com"})
	require.NoError(t, err)
	require.Empty(t, idemgrpc.Reason(st.Err()))
}
