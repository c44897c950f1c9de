package idemgrpc_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/internal/testpb"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/faultproxy"
)

// TestStoreFaults puts a Postgres-aware proxy between the interceptor and the database.
func TestStoreFaults(t *testing.T) {
	t.Parallel()

	// faultySetup returns a bundle whose pool checks results directly, and a client of a server
	// whose interceptor's pool goes through the proxy.
	faultySetup := func(t *testing.T) (*testBundle, *faultproxy.Proxy, testpb.LedgerClient) {
		dbURL := idemtest.NewDB(t, nil)
		proxied, proxy := faultproxy.NewPool(t, dbURL)
		direct, err := pgxpool.New(t.Context(), dbURL)
		require.NoError(t, err)
		t.Cleanup(direct.Close)
		_, err = direct.Exec(t.Context(), `CREATE TABLE effects (id bigserial PRIMARY KEY, note text NOT NULL)`)
		require.NoError(t, err)
		b := &testBundle{ctx: t.Context(), pool: direct}
		intercept, err := idemgrpc.UnaryServerInterceptor(proxied, config())
		require.NoError(t, err)
		return b, proxy, serveWith(t, intercept, serveOpts{record: b.record})
	}

	t.Run("LostCommitReplyIsResolvedByReplay", func(t *testing.T) {
		t.Parallel()
		b, proxy, c := faultySetup(t)
		proxy.LoseNextCommitReply()
		// The COMMIT lands but its answer is lost. tx.Run runs the transaction again, which
		// finds the stored answer: the client gets it, and the effect happened once.
		var h metadata.MD
		out, err := c.Record(keyed(b.ctx, "k1"), request("n"), grpc.Header(&h))
		require.NoError(t, err)
		require.EqualValues(t, 1, out.GetId())
		// It is marked replayed: the rerun read it from the store, as any retry would.
		require.Equal(t, []string{"true"}, h.Get("idempotent-replayed"))
		require.EqualValues(t, 1, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
		require.Equal(t, 1, proxy.Stats().LostCommitReplies)
	})

	t.Run("DroppedCommitRunsAgain", func(t *testing.T) {
		t.Parallel()
		b, proxy, c := faultySetup(t)
		proxy.DropNextCommit()
		var h metadata.MD
		_, err := c.Record(keyed(b.ctx, "k1"), request("n"), grpc.Header(&h))
		require.NoError(t, err)
		require.Empty(t, h.Get("idempotent-replayed"))
		require.EqualValues(t, 2, b.runs.Load())
		require.Equal(t, 1, b.effects(t))
		require.Equal(t, 1, proxy.Stats().DroppedCommits)
	})

	t.Run("StoreGoneIsUnavailable", func(t *testing.T) {
		t.Parallel()
		b, proxy, c := faultySetup(t)
		require.NoError(t, proxy.Close())
		_, err := c.Record(keyed(b.ctx, "k1"), request("n"))
		st := refused(t, err, codes.Unavailable, idemgrpc.ReasonStoreUnavailable)
		var retry *errdetails.RetryInfo
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				retry = ri
			}
		}
		require.NotNil(t, retry)
		require.Equal(t, idemgrpc.DefaultUnavailableRetryDelay, retry.GetRetryDelay().AsDuration())
		require.Zero(t, b.runs.Load(), "fails closed: the handler did not run")
	})
}
