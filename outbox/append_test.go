package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/tx"
)

func TestAppend(t *testing.T) {
	t.Parallel()

	t.Run("InvalidMessagesWriteNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ok := outbox.Message{Topic: "t", Key: "k", Payload: []byte("x")}
		for _, c := range []struct {
			name string
			msg  outbox.Message
			opts []outbox.Option
			want string
		}{
			{"EmptyTopic", outbox.Message{Key: "k"}, nil, "Topic is empty"},
			{"LongKey", outbox.Message{Topic: "t", Key: strings.Repeat("k", outbox.MaxKey+1)}, nil, "Key is 513 bytes, more than 512"},
			{"KeyNotText", outbox.Message{Topic: "t", Key: "a\x00b"}, nil, "not UTF-8 text without NUL"},
			{"LargePayload", outbox.Message{Topic: "t", Payload: make([]byte, outbox.DefaultMaxPayload+1)}, nil, "more than the 1048576 that MaxPayload allows"},
			{"PayloadOverOption", outbox.Message{Topic: "t", Payload: make([]byte, 11)}, []outbox.Option{outbox.MaxPayload(10)}, "more than the 10"},
			{"EmptyHeaderName", outbox.Message{Topic: "t", Headers: map[string]string{"": "v"}}, nil, "header"},
		} {
			t.Run(c.name, func(t *testing.T) {
				err := pgx.BeginFunc(b.ctx, b.pool, func(t pgx.Tx) error {
					// In a batch with a valid message: the whole batch is refused.
					_, err := outbox.AppendBatch(b.ctx, t, []outbox.Message{ok, c.msg}, c.opts...)
					return err
				})
				require.ErrorIs(t, err, outbox.ErrInvalidMessage)
				require.ErrorContains(t, err, c.want)
				require.ErrorContains(t, err, "message 1 of the batch")
				_, err = outbox.Append(b.ctx, nil, c.msg, c.opts...)
				require.Error(t, err)
			})
		}
		require.Empty(t, b.counts(t), "nothing was written")
		_, err := outbox.Append(b.ctx, nil, ok, outbox.MaxPayload(0))
		require.ErrorContains(t, err, "MaxPayload must be at least 1 byte")
	})

	t.Run("RolledBackWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		boom := errors.New("boom")
		err := tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			if _, err := outbox.Append(ctx, t, outbox.Message{Topic: "t", Key: "k"}); err != nil {
				return err
			}
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Empty(t, b.counts(t))
	})

	// In tx.Run the INSERT goes with COMMIT; in a plain transaction it is sent at once. Both
	// number a key's messages in order.
	t.Run("DeferredAndImmediate", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		msg := outbox.Message{Topic: "t", Key: "k", Payload: []byte("x"), Headers: map[string]string{"Content-Type": "text/plain"}}
		var deferred, immediate, inDo [16]byte
		require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			id, err := outbox.Append(ctx, t, msg)
			deferred = id
			return err
		}))
		require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(t pgx.Tx) error {
			id, err := outbox.Append(b.ctx, t, msg)
			immediate = id
			return err
		}))
		_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: "s", ID: "once"}, func(ctx context.Context, t pgx.Tx) (string, error) {
			id, err := outbox.Append(ctx, t, msg)
			inDo = id
			return id.String(), err
		})
		require.NoError(t, err)
		for i, id := range [][16]byte{deferred, immediate, inDo} {
			info, err := outbox.Get(b.ctx, b.pool, id)
			require.NoError(t, err)
			require.EqualValues(t, i+1, info.Seq)
			require.Equal(t, outbox.StatusPending, info.Status)
			require.Equal(t, msg.Headers, info.Headers)
			require.Equal(t, msg.Payload, info.Payload)
		}
	})

	t.Run("MissingTables", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		err := pgx.BeginFunc(b.ctx, b.pool, func(t pgx.Tx) error {
			_, err := outbox.Append(b.ctx, t, outbox.Message{Topic: "t"}, outbox.Schema("elsewhere"))
			return err
		})
		require.ErrorContains(t, err, "run idem.Migrate")
	})
}
