package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestKeyGet(t *testing.T) {
	t.Parallel()

	t.Run("StoredResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := idem.Key{Scope: "s", ID: "k1", Fingerprint: idem.Fingerprint("req")}
		_, err := idem.Run(b.ctx, b.pool, key, recordEffect("k1", "n", nil), idem.TTL(time.Hour))
		require.NoError(t, err)

		info, err := idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: "s", ID: "k1"})
		require.NoError(t, err)
		require.Equal(t, "s", info.Scope)
		require.Equal(t, "k1", info.ID)
		require.Equal(t, key.Fingerprint, info.Fingerprint)
		require.NotNil(t, info.Expires)
		require.InDelta(t, time.Hour.Seconds(), info.Expires.Sub(info.Created).Seconds(), 1)
		require.False(t, info.Expired)
		var size int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT octet_length(result) FROM idem_keys`).Scan(&size))
		require.Equal(t, size, info.ResultSize)
		require.Empty(t, info.Workflow)
		require.Equal(t, 1, b.effects(t, "k1"), "reading ran nothing")
	})

	t.Run("Expired", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: "s", ID: "k1"}, recordEffect("k1", "n", nil))
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 second'`)
		require.NoError(t, err)
		info, err := idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: "s", ID: "k1"})
		require.NoError(t, err)
		require.True(t, info.Expired)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_keys`), "reading deletes nothing")
	})

	t.Run("RunKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.seedRun(t, "s", "run-1", "payout", "failed", "now() + interval '1 hour'")
		info, err := idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: "s", ID: "run-1"})
		require.NoError(t, err)
		require.Equal(t, "payout", info.Workflow)
		require.Equal(t, "failed", info.RunState)
		require.Nil(t, info.Expires, "a run's key expires with its run")
		require.False(t, info.Expired)
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: "s", ID: "nope"})
		require.ErrorIs(t, err, idem.ErrNotFound)
		require.ErrorContains(t, err, `"nope"`)
	})

	t.Run("InvalidKey", func(t *testing.T) {
		t.Parallel()
		_, err := idem.KeyGet(context.Background(), nil, idem.Key{Scope: "s", ID: "a b"})
		require.Error(t, err)
		_, err = idem.KeyGet(context.Background(), dummyQuerier{}, idem.Key{Scope: "s", ID: "a b"})
		require.ErrorIs(t, err, idem.ErrInvalidKey)
	})
}

func TestKeyDelete(t *testing.T) {
	t.Parallel()

	t.Run("ForgetsResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := idem.Key{Scope: "s", ID: "k1"}
		first, err := idem.Run(b.ctx, b.pool, key, recordEffect("k1", "first", nil))
		require.NoError(t, err)
		require.NoError(t, idem.KeyDelete(b.ctx, b.pool, key))
		second, err := idem.Run(b.ctx, b.pool, key, recordEffect("k1", "second", nil))
		require.NoError(t, err)
		require.Equal(t, "second", second.Note, "the key ran again")
		require.NotEqual(t, first.EffectID, second.EffectID)
		require.Equal(t, 2, b.effects(t, "k1"))

		require.ErrorIs(t, idem.KeyDelete(b.ctx, b.pool, idem.Key{Scope: "s", ID: "nope"}), idem.ErrNotFound)
	})

	// A real Do holds the key (its fn is running, nothing is stored yet) in another transaction:
	// the delete is refused at once, and deletes nothing once the Do has committed unless asked
	// again.
	t.Run("RefusedInFlight", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := idem.Key{Scope: "s", ID: "k1"}
		entered, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := idem.Run(b.ctx, b.pool, key, func(ctx context.Context, t pgx.Tx) (string, error) {
				close(entered)
				<-release
				_, err := t.Exec(ctx, `INSERT INTO effects (key) VALUES ('k1')`)
				return "ok", err
			})
			done <- err
		}()
		<-entered
		err := idem.KeyDelete(b.ctx, b.pool, key)
		require.ErrorIs(t, err, idem.ErrInFlight)
		var inflight *idem.InFlightError
		require.True(t, errors.As(err, &inflight))
		require.False(t, inflight.Race)
		close(release)
		require.NoError(t, <-done)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_keys`), "the Do's result is stored")

		// An expired result being replaced by a Do is in flight too.
		_, err = b.pool.Exec(b.ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 second'`)
		require.NoError(t, err)
		entered, release = make(chan struct{}), make(chan struct{})
		go func() {
			_, err := idem.Run(b.ctx, b.pool, key, func(ctx context.Context, t pgx.Tx) (string, error) {
				close(entered)
				<-release
				return "again", nil
			})
			done <- err
		}()
		<-entered
		require.ErrorIs(t, idem.KeyDelete(b.ctx, b.pool, key), idem.ErrInFlight)
		close(release)
		require.NoError(t, <-done)
		require.NoError(t, idem.KeyDelete(b.ctx, b.pool, key))
		require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys`))
	})

	t.Run("RefusedForRunKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.seedRun(t, "s", "run-1", "payout", "done", "now() + interval '1 hour'")
		err := idem.KeyDelete(b.ctx, b.pool, idem.Key{Scope: "s", ID: "run-1"})
		require.ErrorContains(t, err, `workflow "payout"`)
		require.ErrorContains(t, err, "RunCancel")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_keys`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs`))
	})

	t.Run("InTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := idem.Key{Scope: "s", ID: "k1"}
		_, err := idem.Run(b.ctx, b.pool, key, recordEffect("k1", "n", nil))
		require.NoError(t, err)
		// Rolled back with the caller's transaction.
		err = b.inTx(t, pgx.TxOptions{}, func(t pgx.Tx) error {
			if err := idem.KeyDelete(b.ctx, t, key); err != nil {
				return err
			}
			return errors.New("changed my mind")
		})
		require.EqualError(t, err, "changed my mind")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_keys`))
	})
}

// count runs a count(*) query.
func (b *testBundle) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// dummyQuerier is a Querier that is never called: the key is refused before any SQL.
type dummyQuerier struct{ idem.Querier }
