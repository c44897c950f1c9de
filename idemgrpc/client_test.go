package idemgrpc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
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

// scripted is a server that answers Record from a script, one step per attempt (the last step
// repeats), and notes the key each attempt carried.
type scripted struct {
	mu    sync.Mutex
	steps []func(ctx context.Context) (*testpb.RecordReply, error)
	keys  []string // one per attempt; "" when the attempt had none
}

func (s *scripted) record(ctx context.Context, _ *testpb.RecordRequest) (*testpb.RecordReply, error) {
	s.mu.Lock()
	n := len(s.keys)
	key := metadata.ValueFromIncomingContext(ctx, "idempotency-key")
	s.keys = append(s.keys, append(key, "")[0])
	step := s.steps[min(n, len(s.steps)-1)]
	s.mu.Unlock()
	return step(ctx)
}

func (s *scripted) attempts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func fail(code codes.Code, retryAfter time.Duration) func(context.Context) (*testpb.RecordReply, error) {
	return func(context.Context) (*testpb.RecordReply, error) {
		st := status.New(code, "scripted "+code.String())
		if retryAfter > 0 {
			st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
		}
		return nil, st.Err()
	}
}

func succeed(id int64) func(context.Context) (*testpb.RecordReply, error) {
	return func(context.Context) (*testpb.RecordReply, error) { return &testpb.RecordReply{Id: id}, nil }
}

// passThrough stands where the server interceptor would be.
func passThrough(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	return h(ctx, req)
}

// clientFor serves script and returns a client whose connection uses the client interceptor.
func clientFor(t *testing.T, s *scripted, cfg *idemgrpc.ClientConfig) testpb.LedgerClient {
	t.Helper()
	if cfg == nil {
		cfg = &idemgrpc.ClientConfig{}
	}
	if cfg.Methods == nil {
		cfg.Methods = []string{recordMethod}
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 2*time.Millisecond
	}
	intercept, err := idemgrpc.UnaryClientInterceptor(cfg)
	require.NoError(t, err)
	return serveWith(t, passThrough, serveOpts{record: s.record, dial: []grpc.DialOption{grpc.WithChainUnaryInterceptor(intercept)}})
}

func TestClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AddsAUUIDv7KeyAndLeavesTheCallersMetadataAlone", func(t *testing.T) {
		t.Parallel()
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){succeed(1)}}
		c := clientFor(t, s, nil)
		md := metadata.Pairs("x-user", "alice")
		_, err := c.Record(metadata.NewOutgoingContext(ctx, md), request("n"))
		require.NoError(t, err)
		keys := s.attempts()
		require.Len(t, keys, 1)
		id, err := uuid.Parse(keys[0])
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), id.Version())
		require.Equal(t, metadata.Pairs("x-user", "alice"), md, "the caller's metadata is unchanged")

		_, err = c.Record(ctx, request("n"))
		require.NoError(t, err)
		require.NotEqual(t, keys[0], s.attempts()[1], "each call gets its own key")
	})

	t.Run("KeepsTheCallersKey", func(t *testing.T) {
		t.Parallel()
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){fail(codes.Unavailable, 0), succeed(1)}}
		c := clientFor(t, s, nil)
		_, err := c.Record(metadata.AppendToOutgoingContext(ctx, "idempotency-key", "job-42"), request("n"))
		require.NoError(t, err)
		require.Equal(t, []string{"job-42", "job-42"}, s.attempts())
	})

	t.Run("OtherMethodsAreUntouched", func(t *testing.T) {
		t.Parallel()
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){fail(codes.Unavailable, 0)}}
		cfg := &idemgrpc.ClientConfig{Methods: []string{lookupMethod}}
		c := clientFor(t, s, cfg)
		_, err := c.Record(ctx, request("n"))
		require.Equal(t, codes.Unavailable, status.Code(err))
		require.Equal(t, []string{""}, s.attempts(), "one attempt, no key")
	})

	t.Run("RetriesWithTheSameKey", func(t *testing.T) {
		t.Parallel()
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){
			fail(codes.Unavailable, 0), fail(codes.Aborted, 0), fail(codes.ResourceExhausted, 0),
			func(ctx context.Context) (*testpb.RecordReply, error) {
				_ = grpc.SetHeader(ctx, metadata.Pairs("x-attempt", "last"))
				return succeed(7)(ctx)
			},
		}}
		c := clientFor(t, s, nil)
		var h metadata.MD
		out, err := c.Record(ctx, request("n"), grpc.Header(&h))
		require.NoError(t, err)
		require.True(t, proto.Equal(&testpb.RecordReply{Id: 7}, out))
		keys := s.attempts()
		require.Len(t, keys, 4)
		for _, k := range keys {
			require.Equal(t, keys[0], k)
		}
		require.Equal(t, []string{"last"}, h.Get("x-attempt"), "the caller's own Header option gets the last attempt's")
	})

	t.Run("OtherCodesAreFinal", func(t *testing.T) {
		t.Parallel()
		for _, code := range []codes.Code{codes.InvalidArgument, codes.FailedPrecondition, codes.Internal, codes.Unknown, codes.NotFound, codes.DeadlineExceeded} {
			s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){fail(code, 0), succeed(1)}}
			c := clientFor(t, s, nil)
			_, err := c.Record(ctx, request("n"))
			require.Equal(t, code, status.Code(err))
			require.Len(t, s.attempts(), 1, code.String())
		}
	})

	t.Run("AReplayIsNeverRetried", func(t *testing.T) {
		t.Parallel()
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){func(ctx context.Context) (*testpb.RecordReply, error) {
			_ = grpc.SetHeader(ctx, metadata.Pairs("idempotent-replayed", "true"))
			return nil, status.Error(codes.Unavailable, "stored long ago")
		}, succeed(1)}}
		c := clientFor(t, s, nil)
		_, err := c.Record(ctx, request("n"))
		require.Equal(t, codes.Unavailable, status.Code(err))
		require.Len(t, s.attempts(), 1)
	})

	t.Run("MaxAttempts", func(t *testing.T) {
		t.Parallel()
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){fail(codes.Unavailable, 0)}}
		c := clientFor(t, s, &idemgrpc.ClientConfig{MaxAttempts: 3})
		_, err := c.Record(ctx, request("n"))
		require.Equal(t, codes.Unavailable, status.Code(err))
		require.Equal(t, "scripted Unavailable", status.Convert(err).Message(), "the last error, as it came")
		require.Len(t, s.attempts(), 3)
	})

	t.Run("HonoursRetryInfo", func(t *testing.T) {
		t.Parallel()
		const delay = 150 * time.Millisecond
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){fail(codes.Aborted, delay), succeed(1)}}
		c := clientFor(t, s, nil)
		start := time.Now()
		_, err := c.Record(ctx, request("n"))
		require.NoError(t, err)
		require.GreaterOrEqual(t, time.Since(start), delay, "the retry waited as RetryInfo asked, not the 2ms backoff")
		require.Len(t, s.attempts(), 2)
	})

	t.Run("RetryInfoBeyondTheMaxIsReturned", func(t *testing.T) {
		t.Parallel()
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){fail(codes.Aborted, time.Minute), succeed(1)}}
		c := clientFor(t, s, nil)
		_, err := c.Record(ctx, request("n"))
		require.Equal(t, codes.Aborted, status.Code(err))
		require.Len(t, s.attempts(), 1)
	})

	t.Run("NeverWaitsPastTheDeadline", func(t *testing.T) {
		t.Parallel()
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){fail(codes.Aborted, 10*time.Second), succeed(1)}}
		c := clientFor(t, s, nil)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.Record(cctx, request("n"))
		require.Equal(t, codes.Aborted, status.Code(err), "the server's answer, not a deadline of our own making")
		require.NoError(t, cctx.Err(), "returned at once instead of sleeping into the deadline")
		require.Len(t, s.attempts(), 1)
	})

	t.Run("StopsWhenTheContextIsDone", func(t *testing.T) {
		t.Parallel()
		cctx, cancel := context.WithCancel(ctx)
		s := &scripted{steps: []func(context.Context) (*testpb.RecordReply, error){func(context.Context) (*testpb.RecordReply, error) {
			cancel() // the caller gives up while its first attempt is answered
			return fail(codes.Aborted, 10*time.Second)(ctx)
		}}}
		c := clientFor(t, s, nil)
		_, err := c.Record(cctx, request("n"))
		require.Contains(t, []codes.Code{codes.Aborted, codes.Canceled}, status.Code(err))
		require.Len(t, s.attempts(), 1)
	})
}

func TestClientSetup(t *testing.T) {
	t.Parallel()
	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		_, err := idemgrpc.UnaryClientInterceptor(nil)
		require.ErrorContains(t, err, "ClientConfig cannot be nil")

		for name, tc := range map[string]struct {
			cfg  idemgrpc.ClientConfig
			want string
		}{
			"NoMethods":      {idemgrpc.ClientConfig{}, "Methods cannot be empty"},
			"Streaming":      {idemgrpc.ClientConfig{Methods: []string{followMethod}}, "cannot include streaming methods"},
			"Unknown":        {idemgrpc.ClientConfig{Methods: []string{"/no.such.Service/Do"}}, "is registered"},
			"NegativeMin":    {idemgrpc.ClientConfig{Methods: []string{recordMethod}, MinBackoff: -1}, "MinBackoff cannot be negative"},
			"MaxBelowMin":    {idemgrpc.ClientConfig{Methods: []string{recordMethod}, MinBackoff: time.Second, MaxBackoff: time.Millisecond}, "MaxBackoff cannot be less than MinBackoff"},
			"NegativeRetry":  {idemgrpc.ClientConfig{Methods: []string{recordMethod}, MaxRetryDelay: -1}, "MaxRetryDelay cannot be negative"},
			"NegativeTries":  {idemgrpc.ClientConfig{Methods: []string{recordMethod}, MaxAttempts: -1}, "MaxAttempts cannot be negative"},
			"KeyUpperCase":   {idemgrpc.ClientConfig{Methods: []string{recordMethod}, KeyMetadata: "Key"}, "KeyMetadata must be a lower-case"},
			"ReplayedBinary": {idemgrpc.ClientConfig{Methods: []string{recordMethod}, ReplayedMetadata: "r-bin"}, "ReplayedMetadata cannot end in -bin"},
		} {
			_, err := idemgrpc.UnaryClientInterceptor(&tc.cfg)
			require.ErrorContains(t, err, tc.want, name)
		}
		_, err = idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientConfig{Methods: []string{recordMethod}})
		require.NoError(t, err)
	})
}
