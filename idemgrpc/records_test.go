package idemgrpc_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/internal/testpb"
	"github.com/idemkit/idem/internal/recordtest"
	"github.com/idemkit/idem/internal/redact"
)

// TestKeysNotRecorded: the interceptor's spans (idem.Do's), metric points and log records, at
// debug level, never carry a call's key, not even in the error texts they record: a stored
// answer, a replay, a reused key, a handler whose failed statement's error quotes the key and
// which answers anyway, and a store that cannot be reached (whose log record named the key). With
// RecordKeys they do, which shows the test can see them.
func TestKeysNotRecorded(t *testing.T) {
	t.Parallel()
	for _, full := range []bool{false, true} {
		b := setup(t)
		c := recordtest.New(t)
		cfg := config()
		cfg.Logger, cfg.TracerProvider, cfg.MeterProvider, cfg.RecordKeys = c.Logger, c.TP, c.MP, full
		client := b.serve(t, serveOpts{cfg: cfg, record: func(ctx context.Context, req *testpb.RecordRequest) (*testpb.RecordReply, error) {
			if req.GetNote() != "quote the key" {
				return b.record(ctx, req)
			}
			tx, _ := idemgrpc.Tx(ctx)
			// Postgres quotes the value it cannot read, here the key; the handler answers anyway.
			var n int
			_ = tx.QueryRow(ctx, `SELECT $1::int`, req.GetAccount()).Scan(&n)
			return &testpb.RecordReply{Note: "ok"}, nil
		}})
		lost := *cfg
		lost.Schema = "nowhere" // no tables: the store cannot record the call
		lostClient := b.serve(t, serveOpts{cfg: &lost})
		call := func(client testpb.LedgerClient, key, note, account string) error {
			ctx := metadata.AppendToOutgoingContext(b.ctx, "x-user", "alice", "idempotency-key", key)
			_, err := client.Record(ctx, &testpb.RecordRequest{Account: account, Note: note})
			return err
		}
		stored, quoted, unrecorded := "order-7f3a9c-stored", "order-7f3a9c-quoted", "order-7f3a9c-unrecorded"
		require.NoError(t, call(client, stored, "n", "a"))
		require.NoError(t, call(client, stored, "n", "a"), "a replay")
		require.Equal(t, codes.FailedPrecondition, status.Code(call(client, stored, "another request", "a")))
		require.Equal(t, codes.Internal, status.Code(call(client, quoted, "quote the key", quoted)))
		require.Equal(t, codes.Unavailable, status.Code(call(lostClient, unrecorded, "n", "a")))

		records := c.Records(t)
		joined := ""
		for _, r := range records {
			joined += r + "\n"
		}
		require.Contains(t, joined, "the handler answered after a statement in its transaction failed")
		require.Contains(t, joined, "error running guarded call")
		if full {
			require.Contains(t, joined, unrecorded, "RecordKeys records the key itself")
			continue
		}
		c.RequireAbsent(t, stored, quoted, unrecorded)
		require.Contains(t, joined, redact.Hash("alice", unrecorded), "the log record names the key by its hash")
	}
}
