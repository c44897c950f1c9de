package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
)

func TestInbox(t *testing.T) {
	t.Parallel()

	type bundle struct {
		*testBundle
		inbox *outbox.Inbox
	}
	setupInbox := func(t *testing.T) *bundle {
		b := setup(t)
		_, err := b.pool.Exec(b.ctx, `CREATE TABLE effects (id text)`)
		require.NoError(t, err)
		inbox, err := outbox.NewInbox(b.pool, "ledger", nil)
		require.NoError(t, err)
		return &bundle{testBundle: b, inbox: inbox}
	}
	effect := func(id string) func(ctx context.Context, t pgx.Tx) error {
		return func(ctx context.Context, t pgx.Tx) error {
			_, err := t.Exec(ctx, `INSERT INTO effects VALUES ($1)`, id)
			return err
		}
	}
	count := func(t *testing.T, b *bundle) int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects`).Scan(&n))
		return n
	}

	t.Run("OncePerMessage", func(t *testing.T) {
		t.Parallel()
		b := setupInbox(t)
		ran, err := b.inbox.Handle(b.ctx, "m-1", effect("m-1"))
		require.NoError(t, err)
		require.True(t, ran)
		ran, err = b.inbox.Handle(b.ctx, "m-1", effect("m-1"))
		require.NoError(t, err)
		require.False(t, ran, "a redelivery is acknowledged without running")
		other, err := outbox.NewInbox(b.pool, "audit", nil)
		require.NoError(t, err)
		ran, err = other.Handle(b.ctx, "m-1", effect("m-1"))
		require.NoError(t, err)
		require.True(t, ran, "another consumer handles it for itself")
		require.Equal(t, 2, count(t, b))
	})

	t.Run("ConcurrentDeliveries", func(t *testing.T) {
		t.Parallel()
		b := setupInbox(t)
		var runs atomic.Int64
		var wg sync.WaitGroup
		var handled atomic.Int64
		for range 10 {
			wg.Go(func() {
				for {
					_, err := b.inbox.Handle(b.ctx, "m-1", func(ctx context.Context, t pgx.Tx) error {
						runs.Add(1)
						time.Sleep(20 * time.Millisecond)
						return effect("m-1")(ctx, t)
					})
					if errors.Is(err, idem.ErrInFlight) {
						time.Sleep(10 * time.Millisecond) // the broker redelivers later
						continue
					}
					require.NoError(t, err)
					handled.Add(1)
					return
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, 10, handled.Load())
		// The handler runs once, except in idem.Do's documented race (a duplicate that committed
		// after another's snapshot: that one's run is rolled back and it replays): what must
		// hold is one effect.
		require.GreaterOrEqual(t, runs.Load(), int64(1))
		require.Equal(t, 1, count(t, b))
	})

	t.Run("FailureRecordsNothing", func(t *testing.T) {
		t.Parallel()
		b := setupInbox(t)
		boom := errors.New("boom")
		_, err := b.inbox.Handle(b.ctx, "m-1", func(ctx context.Context, t pgx.Tx) error {
			if err := effect("m-1")(ctx, t); err != nil {
				return err
			}
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Zero(t, count(t, b))
		ran, err := b.inbox.Handle(b.ctx, "m-1", effect("m-1"))
		require.NoError(t, err)
		require.True(t, ran, "the redelivery runs it")
		require.Equal(t, 1, count(t, b))
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		b := setupInbox(t)
		_, err := b.inbox.Handle(b.ctx, "", effect("x"))
		require.ErrorIs(t, err, idem.ErrInvalidKey)
		require.ErrorContains(t, err, "message's id cannot key the inbox")
		_, err = b.inbox.Handle(b.ctx, "has space", effect("x"))
		require.ErrorIs(t, err, idem.ErrInvalidKey)
		_, err = b.inbox.Handle(b.ctx, "m", nil)
		require.ErrorContains(t, err, "fn is nil")
		_, err = outbox.NewInbox(b.pool, "", nil)
		require.ErrorContains(t, err, "consumer is empty")
		_, err = outbox.NewInbox(nil, "c", nil)
		require.ErrorContains(t, err, "db is nil")
		_, err = outbox.NewInbox(b.pool, "c", &outbox.InboxOpts{TTL: time.Millisecond})
		require.ErrorContains(t, err, "TTL cannot be less than one second")
		require.Zero(t, count(t, b))
	})

	// The inbox's records are keys of idem.Do, kept for the TTL and reaped by idem.Reap.
	t.Run("ReapedAfterTTL", func(t *testing.T) {
		t.Parallel()
		b := setupInbox(t)
		short, err := outbox.NewInbox(b.pool, "short", &outbox.InboxOpts{TTL: time.Second})
		require.NoError(t, err)
		_, err = short.Handle(b.ctx, "m-1", effect("m-1"))
		require.NoError(t, err)
		info, err := idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: "idem.inbox:short", ID: "m-1"})
		require.NoError(t, err)
		require.WithinDuration(t, info.Created.Add(time.Second), *info.Expires, time.Millisecond)
		_, err = idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: "idem.inbox:ledger", ID: "m-1"})
		require.ErrorIs(t, err, idem.ErrNotFound, "nothing under the other consumer")
		_, err = b.inbox.Handle(b.ctx, "m-2", effect("m-2"))
		require.NoError(t, err)
		info, err = idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: "idem.inbox:ledger", ID: "m-2"})
		require.NoError(t, err)
		require.WithinDuration(t, info.Created.Add(outbox.DefaultInboxTTL), *info.Expires, time.Millisecond, "kept 7 days by default")

		time.Sleep(1100 * time.Millisecond)
		n, err := idem.Reap(b.ctx, b.pool)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		_, err = idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: "idem.inbox:short", ID: "m-1"})
		require.ErrorIs(t, err, idem.ErrNotFound)
	})
}
