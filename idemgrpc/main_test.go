package idemgrpc_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/internal/testpb"
	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

const (
	recordMethod = "/idemgrpc.test.v1.Ledger/Record"
	lookupMethod = "/idemgrpc.test.v1.Ledger/Lookup"
	followMethod = "/idemgrpc.test.v1.Ledger/Follow"
)

// recordFunc is the Record handler a test serves.
type recordFunc func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error)

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	runs atomic.Int64 // handler executions, rolled back or not
}

// setup gives each test its own database with idem migrated and a table of effects, so that
// tests count what committed instead of trusting answers.
func setup(t testing.TB) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	require.NoError(t, idem.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, note text NOT NULL)`)
	require.NoError(t, err)
	return &testBundle{ctx: ctx, pool: pool}
}

// userScope scopes keys by a test metadata value; real applications use their authenticated
// principal.
func userScope(ctx context.Context) string {
	vs := metadata.ValueFromIncomingContext(ctx, "x-user")
	if len(vs) != 1 {
		return ""
	}
	return vs[0]
}

// config returns the tests' default server configuration.
func config() *idemgrpc.Config {
	return &idemgrpc.Config{
		Scope:      userScope,
		Methods:    []string{recordMethod},
		MinBackoff: time.Nanosecond, MaxBackoff: time.Nanosecond,
		Logger: quietLogger(),
	}
}

// record is the business handler used throughout: it counts its run, writes one effect row
// through the call's transaction, sets metadata, and answers with the row's id and the request.
func (b *testBundle) record(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
	b.runs.Add(1)
	t, ok := idemgrpc.Tx(ctx)
	if !ok {
		return nil, status.Error(codes.FailedPrecondition, "not guarded")
	}
	var id int64
	if err := t.QueryRow(ctx, `INSERT INTO effects (note) VALUES ($1) RETURNING id`, req.GetNote()).Scan(&id); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-effect-id", strconv.FormatInt(id, 10), "x-blob-bin", "\x00\xff\xfe")); err != nil {
		return nil, err
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-checksum", "c-"+strconv.FormatInt(id, 10))); err != nil {
		return nil, err
	}
	return &testpb.RecordReply{
		Id: id, Account: req.GetAccount(), Amount: req.GetAmount(), Note: req.GetNote(),
		Labels: req.GetLabels(), Blob: req.GetBlob(), History: []string{"created", "stored"},
	}, nil
}

// ledger serves Record with a test's handler; Lookup and Follow answer trivially.
type ledger struct {
	testpb.UnimplementedLedgerServer
	record recordFunc
}

func (l *ledger) Record(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
	return l.record(ctx, req)
}

func (l *ledger) Lookup(ctx context.Context, req *testpb.LookupRequest) (*testpb.RecordReply, error) {
	_, guarded := idemgrpc.Tx(ctx)
	return &testpb.RecordReply{Id: req.GetId(), Note: strconv.FormatBool(guarded)}, nil
}

// serveOpts are the parts of a test server that vary.
type serveOpts struct {
	cfg    *idemgrpc.Config              // nil: config()
	record recordFunc                    // nil: b.record
	outer  []grpc.UnaryServerInterceptor // run before idem's, outermost first
	dial   []grpc.DialOption             // more options for the client connection
	lis    func(net.Listener) net.Listener
}

// serve starts a real gRPC server on a loopback listener with the interceptor over b.pool, and
// returns a client connected to it.
func (b *testBundle) serve(t testing.TB, o serveOpts) testpb.LedgerClient {
	t.Helper()
	cfg := o.cfg
	if cfg == nil {
		cfg = config()
	}
	intercept, err := idemgrpc.UnaryServerInterceptor(b.pool, cfg)
	require.NoError(t, err)
	if o.record == nil {
		o.record = b.record
	}
	return serveWith(t, intercept, o)
}

// serveWith starts a gRPC server on a loopback listener with intercept innermost and o.record
// serving Record, and returns a client connected to it.
func serveWith(t testing.TB, intercept grpc.UnaryServerInterceptor, o serveOpts) testpb.LedgerClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	if o.lis != nil {
		lis = o.lis(lis)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(o.outer, intercept)...))
	testpb.RegisterLedgerServer(srv, &ledger{record: o.record})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		require.NoError(t, <-served)
	})

	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, o.dial...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return testpb.NewLedgerClient(conn)
}

// keyed returns a context for a call from alice with key (none when "").
func keyed(ctx context.Context, key string) context.Context {
	ctx = metadata.AppendToOutgoingContext(ctx, "x-user", "alice")
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", key)
	}
	return ctx
}

// request is the Record request used throughout.
func request(note string) *testpb.RecordRequest {
	return &testpb.RecordRequest{
		Account: "acct-1", Amount: 250, Note: note,
		Labels: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"},
		Blob:   []byte{0, 1, 2, 0xff},
	}
}

// effects counts committed effect rows.
func (b *testBundle) effects(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects`).Scan(&n))
	return n
}

// storedKeys counts rows in idem_keys.
func (b *testBundle) storedKeys(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idem_keys`).Scan(&n))
	return n
}

// refused checks an error the interceptor answered with itself and returns its status.
func refused(t testing.TB, err error, code codes.Code, reason string) *status.Status {
	t.Helper()
	require.Error(t, err)
	st := status.Convert(err)
	require.Equal(t, code, st.Code(), st.Message())
	require.Equal(t, reason, idemgrpc.Reason(err))
	require.NotEmpty(t, st.Message())
	return st
}

// quietLogger keeps expected server-side errors out of the test output.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
