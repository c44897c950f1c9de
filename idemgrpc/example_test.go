package idemgrpc_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/internal/testpb"
	"github.com/idemkit/idem/idemtest"
)

// exampleLedger records entries through the call's transaction, so each entry commits exactly
// when its answer is stored.
type exampleLedger struct {
	testpb.UnimplementedLedgerServer
}

func (exampleLedger) Record(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
	t, ok := idemgrpc.Tx(ctx)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "send idempotency-key metadata")
	}
	var id int64
	err := t.QueryRow(ctx, `INSERT INTO entries (account, amount) VALUES ($1, $2) RETURNING id`,
		req.GetAccount(), req.GetAmount()).Scan(&id)
	if err != nil {
		return nil, status.Error(codes.Internal, "database error") // not stored: rolled back
	}
	return &testpb.RecordReply{Id: id, Account: req.GetAccount(), Amount: req.GetAmount()}, nil
}

// exampleServer serves exampleLedger behind the idempotency interceptor on a loopback port, over
// a fresh database (DATABASE_URL in a real program), and returns its address and a stop func.
func exampleServer(ctx context.Context) (addr string, pool *pgxpool.Pool, stop func()) {
	pool = idemtest.NewExamplePool(nil)
	if _, err := pool.Exec(ctx, `CREATE TABLE entries (id bigserial PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	intercept, err := idemgrpc.UnaryServerInterceptor(pool, &idemgrpc.Config{
		// Keys are kept per principal. A real server returns the identity its authentication
		// interceptor put in the context.
		Scope: func(ctx context.Context) string {
			if vs := metadata.ValueFromIncomingContext(ctx, "x-user"); len(vs) == 1 {
				return "user:" + vs[0]
			}
			return ""
		},
		Methods: []string{"/idemgrpc.test.v1.Ledger/Record"},
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(intercept))
	testpb.RegisterLedgerServer(srv, exampleLedger{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	return lis.Addr().String(), pool, func() { srv.Stop(); pool.Close() }
}

func ExampleUnaryServerInterceptor() {
	ctx := context.Background()
	addr, pool, stop := exampleServer(ctx)
	defer stop()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ledger := testpb.NewLedgerClient(conn)

	// The same key twice: the second call gets the first answer back, marked replayed.
	ctx = metadata.AppendToOutgoingContext(ctx, "x-user", "42", "idempotency-key", "entry-7f3a")
	for range 2 {
		var header metadata.MD
		out, err := ledger.Record(ctx, &testpb.RecordRequest{Account: "savings", Amount: 250}, grpc.Header(&header))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("entry %d, replayed: %v\n", out.GetId(), header.Get("idempotent-replayed"))
	}

	// The same key for another request is refused.
	_, err = ledger.Record(ctx, &testpb.RecordRequest{Account: "savings", Amount: 999})
	fmt.Println(status.Code(err), idemgrpc.Reason(err))

	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM entries`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("entries:", n)
	// Output:
	// entry 1, replayed: []
	// entry 1, replayed: [true]
	// FailedPrecondition IDEMPOTENCY_KEY_REUSED
	// entries: 1
}

func ExampleUnaryClientInterceptor() {
	ctx := context.Background()
	addr, _, stop := exampleServer(ctx)
	defer stop()

	// Record calls get a UUIDv7 key, and are retried with it until they get an answer.
	intercept, err := idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientConfig{
		Methods: []string{"/idemgrpc.test.v1.Ledger/Record"},
	})
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(intercept))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ledger := testpb.NewLedgerClient(conn)

	out, err := ledger.Record(metadata.AppendToOutgoingContext(ctx, "x-user", "42"),
		&testpb.RecordRequest{Account: "savings", Amount: 250})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("entry", out.GetId())
	// Output:
	// entry 1
}

func ExampleTx() {
	record := func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
		t, ok := idemgrpc.Tx(ctx)
		if !ok {
			return nil, status.Error(codes.InvalidArgument, "send idempotency-key metadata")
		}
		var id int64
		if err := t.QueryRow(ctx, `INSERT INTO entries (amount) VALUES ($1) RETURNING id`, req.GetAmount()).Scan(&id); err != nil {
			return nil, status.Error(codes.Internal, "database error") // Internal is never stored
		}
		return &testpb.RecordReply{Id: id}, nil
	}

	// Outside a guarded call there is no transaction.
	_, err := record(context.Background(), &testpb.RecordRequest{})
	fmt.Println(status.Code(err))
	// Output:
	// InvalidArgument
}

func ExampleReason() {
	ctx := context.Background()
	addr, _, stop := exampleServer(ctx)
	defer stop()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ledger := testpb.NewLedgerClient(conn)
	req := &testpb.RecordRequest{Account: "savings", Amount: 250}

	for _, md := range []metadata.MD{
		metadata.Pairs("idempotency-key", "entry-1"),                   // no identity
		metadata.Pairs("x-user", "42", "idempotency-key", "two words"), // a space
	} {
		_, err := ledger.Record(metadata.NewOutgoingContext(ctx, md), req)
		switch idemgrpc.Reason(err) {
		case idemgrpc.ReasonScopeMissing:
			fmt.Println("authenticate first:", status.Code(err))
		case idemgrpc.ReasonKeyInvalid:
			fmt.Println("fix the key:", status.Convert(err).Message())
		}
	}
	// An error the interceptor did not make has no reason.
	fmt.Printf("%q\n", idemgrpc.Reason(status.Error(codes.NotFound, "no such account")))
	// Output:
	// authenticate first: InvalidArgument
	// fix the key: the idempotency-key metadata is not valid (ID has byte 0x20 at offset 3; only printable ASCII (0x21-0x7E, no spaces) is allowed): send 1 to 255 printable ASCII characters without spaces, such as a UUID
	// ""
}

func ExampleDefaultFingerprint() {
	a := &testpb.RecordRequest{Account: "savings", Amount: 250, Labels: map[string]string{"a": "1", "b": "2"}}
	b := &testpb.RecordRequest{Account: "savings", Amount: 250, Labels: map[string]string{"b": "2", "a": "1"}}
	c := &testpb.RecordRequest{Account: "savings", Amount: 251, Labels: map[string]string{"a": "1", "b": "2"}}
	fa, _ := idemgrpc.DefaultFingerprint("/idemgrpc.test.v1.Ledger/Record", a)
	fb, _ := idemgrpc.DefaultFingerprint("/idemgrpc.test.v1.Ledger/Record", b)
	fc, _ := idemgrpc.DefaultFingerprint("/idemgrpc.test.v1.Ledger/Record", c)
	fd, _ := idemgrpc.DefaultFingerprint("/idemgrpc.test.v1.Ledger/Lookup", a)
	fmt.Println(bytes.Equal(fa, fb), bytes.Equal(fa, fc), bytes.Equal(fa, fd))
	// Output:
	// true false false
}

func ExampleMetadataScope() {
	intercept, err := idemgrpc.UnaryServerInterceptor(nopBeginner{}, &idemgrpc.Config{
		// Keys are kept per API key; the database sees only its digest.
		Scope:   idemgrpc.MetadataScope("x-api-key"),
		Methods: []string{"/idemgrpc.test.v1.Ledger/Record"},
	})
	fmt.Println(intercept != nil, err)
	// Output:
	// true <nil>
}
