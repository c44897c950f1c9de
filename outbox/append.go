package outbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/txctl"
)

// Limits of a message, checked by [Append] before any SQL.
const (
	// DefaultMaxPayload is the largest payload Append takes when no [MaxPayload] option is
	// given: 1 MiB, JetStream's default largest message.
	DefaultMaxPayload = 1 << 20
	// MaxKey is the longest key, in bytes.
	MaxKey = 512
	// MaxTopic is the longest topic, in bytes.
	MaxTopic = 1024
)

// ErrInvalidMessage means a message given to [Append] or [AppendBatch] was refused before anything
// was written; the error says which field is wrong and what to do.
//
//	if errors.Is(err, outbox.ErrInvalidMessage) { ... } // a bug in the caller: do not retry
var ErrInvalidMessage = errors.New("outbox: invalid message")

// Message is what the caller appends: the topic it goes to, the key that orders it, its
// payload and headers.
//
//	msg := outbox.Message{
//		Topic:   "transfer.completed",
//		Key:     "account:42", // messages with one key are published in commit order
//		Payload: body,
//		Headers: map[string]string{"Content-Type": "application/json"},
//	}
type Message struct {
	// Topic is where the publisher sends the message: a NATS subject, an AMQP routing key, a
	// Kafka topic. Required; at most MaxTopic bytes.
	Topic string

	// Key orders messages: the messages of one key are published one after the other, in the
	// order their transactions committed, each only after the broker acknowledged the one
	// before. "" means no order: such a message goes out as soon as it can, beside any other.
	// At most MaxKey bytes of UTF-8.
	Key string

	// Payload is the message's body, at most [MaxPayload] bytes (1 MiB by default).
	Payload []byte

	// Headers go with the message, as the broker carries them (NATS and AMQP headers, Kafka
	// record headers).
	Headers map[string]string
}

// Option configures [Append], [AppendBatch] and the operator's functions ([Get], [List],
// [Retry], [Skip]). An invalid option makes the call fail before any SQL.
//
//	id, err := outbox.Append(ctx, tx, msg, outbox.Schema("billing"))
type Option func(*config)

type config struct {
	schema     string
	maxPayload int
	err        error
}

func newConfig(opts []Option) *config {
	c := &config{maxPayload: DefaultMaxPayload}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Schema names the Postgres schema of idem's tables, as given to idem.Migrate (idem.Schema).
// The default, "", leaves the names unqualified, so that search_path decides.
//
//	outbox.Append(ctx, tx, msg, outbox.Schema("billing"))
func Schema(name string) Option {
	return func(c *config) {
		if len(name) > 63 {
			c.err = fmt.Errorf("outbox: Schema cannot be longer than 63 bytes (got %q)", name)
			return
		}
		c.schema = name
	}
}

// MaxPayload sets the largest payload [Append] takes, in bytes; a larger one is refused with
// [ErrInvalidMessage] and nothing is written. The default is [DefaultMaxPayload]. Keep it within
// what the broker takes (JetStream's max_payload, RabbitMQ's max_message_size, Kafka's
// message.max.bytes): a message the broker refuses goes through the relay's failure policy.
//
//	outbox.Append(ctx, tx, msg, outbox.MaxPayload(8<<20))
func MaxPayload(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.err = fmt.Errorf("outbox: MaxPayload must be at least 1 byte (got %d)", n)
			return
		}
		c.maxPayload = n
	}
}

// Append writes msg to the outbox in t, the caller's transaction, and returns the message's id:
// the message exists if and only if t commits, and a relay ([NewRelay]) then publishes it, at
// least once, always under this id.
//
// t is any pgx transaction: the one idem.Do hands its function, a workflow's steps.Tx, or one
// of the caller's own. Messages with one Key are published in the order their transactions
// committed: Append takes the key's next sequence number in t, with a row lock that a second
// writer of the key waits for until t ends. Append last in t, or keep t short, where one key is
// written by many transactions at once; appending several keys in one transaction in
// different orders can deadlock with another (Postgres aborts one; [tx.Run] retries it), which
// [AppendBatch] avoids by locking its keys in order.
//
// In a transaction of tx.Run (and so of idem.Run, idemhttp's middleware and workflow steps),
// the write is sent with COMMIT, in the same round trip, and the key is locked only while the
// COMMIT runs; the id is known at once. Inside idem.Do, append from Do's function: if the
// COMMIT's answer is lost, tx.Run runs the transaction again, Do replays without calling the
// function, and no second message is written.
//
// A message that is not valid (no topic, a key over MaxKey bytes, a payload over [MaxPayload])
// is refused with [ErrInvalidMessage] before any SQL, and nothing is written.
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
//		if _, err := t.Exec(ctx, `UPDATE accounts SET balance = balance - $1 WHERE id = $2`, amount, from); err != nil {
//			return err
//		}
//		_, err := outbox.Append(ctx, t, outbox.Message{Topic: "transfer.completed", Key: from, Payload: body})
//		return err
//	})
func Append(ctx context.Context, t pgx.Tx, msg Message, opts ...Option) (uuid.UUID, error) {
	ids, err := AppendBatch(ctx, t, []Message{msg}, opts...)
	if err != nil {
		return uuid.UUID{}, err
	}
	return ids[0], nil
}

// AppendBatch is [Append] for many messages in one statement, in the order given: messages of
// one key are numbered in that order. It locks the batch's keys in key order, so that two
// batches cannot deadlock on each other's keys. Every message is checked before any SQL; one
// invalid message refuses the whole batch, and nothing is written.
//
//	ids, err := outbox.AppendBatch(ctx, t, []outbox.Message{
//		{Topic: "order.placed", Key: orderID, Payload: placed},
//		{Topic: "stock.reserved", Key: orderID, Payload: reserved},
//	})
func AppendBatch(ctx context.Context, t pgx.Tx, msgs []Message, opts ...Option) ([]uuid.UUID, error) {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	if t == nil {
		return nil, errors.New("outbox: Append needs a transaction; t is nil")
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	rows := make([]store.OutboxMessage, len(msgs))
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		if err := cfg.check(m); err != nil {
			if len(msgs) > 1 {
				err = fmt.Errorf("message %d of the batch: %w", i, err)
			}
			return nil, err
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("outbox: error making a message id: %w", err)
		}
		ids[i] = id
		rows[i] = store.OutboxMessage{ID: id, Topic: m.Topic, Key: m.Key, Hash: hashOf(m.Key, id), Payload: m.Payload, Headers: m.Headers}
		if rows[i].Payload == nil {
			rows[i].Payload = []byte{}
		}
	}
	stmt, err := store.For(cfg.schema).OutboxAppend(rows)
	if err != nil {
		return nil, fmt.Errorf("outbox: error encoding headers: %w", err)
	}
	if attempt, canDefer := txctl.From(t); attempt != nil && canDefer {
		attempt.Queue(txctl.Deferred{SQL: stmt.SQL, Args: stmt.Args, MapErr: appendError})
	} else if _, err := t.Exec(ctx, stmt.SQL, stmt.Args...); err != nil {
		return nil, appendError(err)
	}
	nudgeLocal()
	return ids, nil
}

// check refuses what would fail later, or be published wrong: the message is the caller's bug,
// and telling it now loses nothing.
func (c *config) check(m Message) error {
	switch {
	case m.Topic == "":
		return fmt.Errorf("%w: Topic is empty; name where the message goes (a NATS subject, an AMQP routing key, a Kafka topic)", ErrInvalidMessage)
	case len(m.Topic) > MaxTopic:
		return fmt.Errorf("%w: Topic is %d bytes, more than %d", ErrInvalidMessage, len(m.Topic), MaxTopic)
	case !storable(m.Topic):
		return fmt.Errorf("%w: Topic %q is not UTF-8 text without NUL bytes", ErrInvalidMessage, m.Topic)
	case len(m.Key) > MaxKey:
		return fmt.Errorf("%w: Key is %d bytes, more than %d; use a shorter key (an id, or a digest of a long one)", ErrInvalidMessage, len(m.Key), MaxKey)
	case !storable(m.Key):
		return fmt.Errorf("%w: Key %q is not UTF-8 text without NUL bytes", ErrInvalidMessage, m.Key)
	case len(m.Payload) > c.maxPayload:
		return fmt.Errorf("%w: Payload is %d bytes, more than the %d that MaxPayload allows; store large content elsewhere and send a reference, or raise MaxPayload within the broker's limit",
			ErrInvalidMessage, len(m.Payload), c.maxPayload)
	}
	for k, v := range m.Headers {
		if k == "" || !storable(k) || !storable(v) {
			return fmt.Errorf("%w: header %q: %q: names must be non-empty, and names and values UTF-8 text without NUL bytes", ErrInvalidMessage, k, v)
		}
	}
	return nil
}

// storable reports whether s can be stored as Postgres text (and jsonb) unchanged.
func storable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// hashOf places a message in a lane: by its key, so that a key stays in one lane, or by its id
// when it has no key, so that unordered messages spread over every lane.
func hashOf(key string, id uuid.UUID) int32 {
	h := fnv.New32a()
	if key != "" {
		h.Write([]byte(key))
	} else {
		h.Write(id[:])
	}
	return int32(h.Sum32() & 0x7fffffff)
}

// appendError explains a failed write; a missing table is the commonest mistake on a new
// database.
func appendError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("outbox: the outbox's tables are missing (%s): run idem.Migrate at startup, with the same Schema as this call: %w", pgErr.Message, err)
	}
	return fmt.Errorf("outbox: error appending message: %w", err)
}
