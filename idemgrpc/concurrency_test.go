package idemgrpc_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/internal/testpb"
)

func TestConcurrency(t *testing.T) {
	t.Parallel()
	const callers = 100

	// blockingServer serves b.record behind the interceptor. The first call to reach the
	// handler waits until every other caller's first attempt has been answered Aborted, so that
	// all of them really are concurrent with it; any other call goes straight through (and
	// would show as a second effect).
	blockingServer := func(t *testing.T, b *testBundle, dial ...grpc.DialOption) testpb.LedgerClient {
		release := make(chan struct{})
		var entered, aborted atomic.Int64
		countAborted := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			out, err := h(ctx, req)
			if status.Code(err) == codes.Aborted && aborted.Add(1) == callers-1 {
				close(release)
			}
			return out, err
		}
		return b.serve(t, serveOpts{
			outer: []grpc.UnaryServerInterceptor{countAborted},
			dial:  dial,
			record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
				if entered.Add(1) == 1 {
					<-release
				}
				return b.record(ctx, req)
			},
		})
	}

	type result struct {
		reply    *testpb.RecordReply
		replayed bool
		err      error
	}
	fire := func(c testpb.LedgerClient, ctx context.Context) []result {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-user", "alice", "idempotency-key", "one-key-for-all")
		results := make([]result, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				var h metadata.MD
				out, err := c.Record(ctx, request("n"), grpc.Header(&h))
				results[i] = result{out, len(h.Get("idempotent-replayed")) > 0, err}
			})
		}
		wg.Wait()
		return results
	}

	t.Run("OneExecutionTheRestAborted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := blockingServer(t, b)
		var ok, aborted int
		var first *testpb.RecordReply
		for _, res := range fire(c, b.ctx) {
			switch status.Code(res.err) {
			case codes.OK:
				ok++
				first = res.reply
				require.False(t, res.replayed)
			case codes.Aborted:
				aborted++
				require.Equal(t, idemgrpc.ReasonKeyInFlight, idemgrpc.Reason(res.err))
			default:
				t.Fatalf("unexpected answer: %v", res.err)
			}
		}
		require.Equal(t, 1, ok)
		require.Equal(t, callers-1, aborted)
		require.Equal(t, 1, b.effects(t))

		var h metadata.MD
		again, err := c.Record(keyed(b.ctx, "one-key-for-all"), request("n"), grpc.Header(&h))
		require.NoError(t, err)
		require.Equal(t, []string{"true"}, h.Get("idempotent-replayed"))
		require.True(t, proto.Equal(first, again))
	})

	t.Run("ThroughTheClientAllGetTheSameAnswer", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		intercept, err := idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientConfig{Methods: []string{recordMethod}})
		require.NoError(t, err)
		c := blockingServer(t, b, grpc.WithChainUnaryInterceptor(intercept))
		results := fire(c, b.ctx)
		replays := 0
		for _, res := range results {
			require.NoError(t, res.err)
			require.True(t, proto.Equal(results[0].reply, res.reply), "%v differs from %v", res.reply, results[0].reply)
			if res.replayed {
				replays++
			}
		}
		require.EqualValues(t, 1, results[0].reply.GetId())
		require.Equal(t, callers-1, replays)
		require.Equal(t, 1, b.effects(t))
		require.EqualValues(t, 1, b.runs.Load())
	})
}

// trackingListener remembers the connections it accepted, so a test can cut them.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// reset cuts every accepted connection with a TCP reset, as a crashed proxy would.
func (l *trackingListener) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	l.conns = nil
}

// TestLostResponse is the failure the client interceptor exists for: the server commits, then
// the connection dies before the answer arrives. The retry must get the stored answer, not run
// the handler again.
func TestLostResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		tl    *trackingListener
		mu    sync.Mutex
		keys  []string
		first = true
	)
	// Outside the idempotency interceptor: it sees the call only after the commit.
	cutAfterCommit := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		keys = append(keys, metadata.ValueFromIncomingContext(ctx, "idempotency-key")...)
		cut := first
		first = false
		mu.Unlock()
		out, err := h(ctx, req)
		if cut {
			tl.reset()
		}
		return out, err
	}
	intercept, err := idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientConfig{Methods: []string{recordMethod}, MinBackoff: time.Millisecond})
	require.NoError(t, err)
	c := b.serve(t, serveOpts{
		outer: []grpc.UnaryServerInterceptor{cutAfterCommit},
		dial:  []grpc.DialOption{grpc.WithChainUnaryInterceptor(intercept)},
		lis: func(l net.Listener) net.Listener {
			tl = &trackingListener{Listener: l}
			return tl
		},
	})

	var h metadata.MD
	out, err := c.Record(metadata.AppendToOutgoingContext(b.ctx, "x-user", "alice"), request("once"), grpc.Header(&h))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.GetId())
	require.Equal(t, []string{"true"}, h.Get("idempotent-replayed"), "the answer came from the store")
	require.GreaterOrEqual(t, len(keys), 2, "the client retried")
	for _, k := range keys {
		require.Equal(t, keys[0], k, "with the same key")
	}
	require.EqualValues(t, 1, b.runs.Load())
	require.Equal(t, 1, b.effects(t))
}
