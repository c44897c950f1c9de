package idem_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/tx"
)

// TestLostCommit cuts the connection while COMMIT is in flight, through a proxy that either lets
// the COMMIT land and swallows its acknowledgement, or drops the COMMIT itself. Either way the
// client sees the same dead connection; a transaction that ran Do must come out right in both.
func TestLostCommit(t *testing.T) {
	t.Parallel()

	// via runs one idempotent transfer-like unit of work through tx.Run+Do or through idem.Run.
	type via func(ctx context.Context, pool *pgxpool.Pool, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) (receipt, error)
	vias := map[string]via{
		"TxRunDo": func(ctx context.Context, pool *pgxpool.Pool, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) (receipt, error) {
			var out receipt
			err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
				var err error
				out, err = idem.Do(ctx, t, k, fn)
				return err
			})
			return out, err
		},
		"IdemRun": func(ctx context.Context, pool *pgxpool.Pool, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) (receipt, error) {
			return idem.Run(ctx, pool, k, fn)
		},
		// A handler that passes the request's context to Do, not tx.Run's: the transaction
		// carries the mark, so the rerun after a lost COMMIT still replays.
		"TxRunDoOtherContext": func(ctx context.Context, pool *pgxpool.Pool, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) (receipt, error) {
			var out receipt
			request := context.WithoutCancel(ctx)
			err := tx.Run(ctx, pool, func(_ context.Context, t pgx.Tx) error {
				var err error
				out, err = idem.Do(request, t, k, fn)
				return err
			})
			return out, err
		},
	}

	for name, run := range vias {
		for _, fault := range []string{"ReplyLost", "CommitDropped"} {
			t.Run(name+"/"+fault, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				proxy, pool := proxied(t, b)

				// Warm up so the proxy sees prepared statements by name, as in a long-lived pool.
				_, err := run(b.ctx, pool, idem.Key{Scope: "s", ID: "warm"}, recordEffect("warm", "", nil))
				require.NoError(t, err)

				if fault == "ReplyLost" {
					proxy.LoseNextCommitReply()
				} else {
					proxy.DropNextCommit()
				}
				ran := 0
				out, err := run(b.ctx, pool, idem.Key{Scope: "s", ID: "k1"}, recordEffect("k1", "once", &ran))
				require.NoError(t, err, "a transaction that ran Do is retried after a lost COMMIT")
				require.Equal(t, 1, b.effects(t, "k1"), "exactly one effect")
				st := proxy.Stats()
				require.Equal(t, 1, st.LostCommitReplies+st.DroppedCommits, "the fault was injected")

				if fault == "ReplyLost" {
					require.Equal(t, 1, ran, "the first COMMIT landed, so the retry replays")
				} else {
					require.Equal(t, 2, ran, "the first COMMIT never arrived, so the retry runs afresh")
				}
				var stored int64
				require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id FROM effects WHERE key = 'k1'`).Scan(&stored))
				require.Equal(t, stored, out.EffectID, "the caller gets the committed result")
			})
		}
	}

	// A single *pgx.Conn dies with the lost COMMIT, so Run cannot retry on it: it must say the
	// outcome is unknown, never report a plain failure for a COMMIT that landed.
	t.Run("IdemRunOnAConnReportsUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		proxy, pool := proxied(t, b)
		conn, err := pgx.Connect(b.ctx, pool.Config().ConnConfig.ConnString())
		require.NoError(t, err)
		defer conn.Close(b.ctx)
		proxy.LoseNextCommitReply()
		_, err = idem.Run(b.ctx, conn, idem.Key{Scope: "s", ID: "k1"}, recordEffect("k1", "x", nil))
		require.ErrorIs(t, err, tx.ErrCommitUnknown)
		require.Equal(t, 1, b.effects(t, "k1"), "and indeed it had landed")
	})

	t.Run("WithoutDoTheOutcomeIsUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		proxy, pool := proxied(t, b)
		proxy.LoseNextCommitReply()
		ran := 0
		err := tx.Run(b.ctx, pool, func(ctx context.Context, t pgx.Tx) error {
			_, err := recordEffect("plain", "x", &ran)(ctx, t)
			return err
		})
		require.ErrorIs(t, err, tx.ErrCommitUnknown)
		require.Equal(t, 1, ran, "never retried blindly")
		require.Equal(t, 1, b.effects(t, "plain"), "and indeed it had landed")
	})
}

// proxied returns a fault proxy in front of b's database and a pool that goes through it.
func proxied(t *testing.T, b *testBundle) (*faultproxy.Proxy, *pgxpool.Pool) {
	t.Helper()
	pool, proxy := faultproxy.NewPool(t, b.pool.Config().ConnString())
	return proxy, pool
}
