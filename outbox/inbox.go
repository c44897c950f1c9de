package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/tx"
)

// DefaultInboxTTL is how long an inbox remembers a message it handled when InboxOpts.TTL is 0.
const DefaultInboxTTL = 7 * 24 * time.Hour

// inboxScope starts the scope of an inbox's keys, so that they cannot meet keys of the
// application's own.
const inboxScope = "idem.inbox:"

// InboxOpts configure an [Inbox]; nil means the defaults.
//
//	inbox, err := outbox.NewInbox(pool, "billing", &outbox.InboxOpts{TTL: 30 * 24 * time.Hour})
type InboxOpts struct {
	// Schema is the Postgres schema of idem's tables, as given to idem.Migrate.
	Schema string

	// TTL is how long a handled message is remembered: a redelivery within it is acknowledged
	// without running the handler again. Keep it longer than the broker may redeliver (a
	// consumer down for a weekend, say). The default is DefaultInboxTTL; idem.Reap deletes
	// what has expired.
	TTL time.Duration

	// Isolation, MaxAttempts and the providers are those of the handler's transaction, as
	// idem.Run's options.
	Isolation      pgx.TxIsoLevel
	MaxAttempts    int
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Inbox is the consumer's side of the outbox: it runs a handler at most once per message id, in
// a transaction that records that it ran, on the machinery of idem.Do (the message id is the
// key, in a scope of the consumer's name). Acknowledge a message to the broker only after
// [Inbox.Handle] returned nil, which is after the COMMIT: a message redelivered after that is
// acknowledged without running the handler; one redelivered before (the consumer died between
// COMMIT and acknowledgement) finds the handler's commit and is acknowledged too.
//
// Brokers redeliver, and the relay publishes at least once; with an inbox the consumer's
// effects in Postgres happen once per message. An effect outside the handler's transaction (a
// call to another service) is not covered: give that service the message id as its
// idempotency key.
//
//	inbox, err := outbox.NewInbox(pool, "ledger", nil)
//	...
//	for msg := range msgs { // a JetStream pull consumer
//		_, err := inbox.Handle(ctx, msg.Headers().Get("Nats-Msg-Id"), func(ctx context.Context, t pgx.Tx) error {
//			return record(ctx, t, msg.Data())
//		})
//		if err != nil {
//			_ = msg.NakWithDelay(time.Second) // not handled: let the broker deliver it again
//			continue
//		}
//		_ = msg.Ack()
//	}
type Inbox struct {
	db       idem.Beginner
	consumer string
	opts     []idem.Option
	txOpts   []tx.Option
}

// NewInbox makes the inbox of the consumer named consumer (its deduplication is per name, so
// two consumers that each handle every message need two names; a consumer group shares one).
// db begins the handler's transactions: a *pgxpool.Pool.
//
//	inbox, err := outbox.NewInbox(pool, "ledger", nil)
func NewInbox(db idem.Beginner, consumer string, opts *InboxOpts) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("outbox: NewInbox needs a database; db is nil")
	}
	if opts == nil {
		opts = &InboxOpts{}
	}
	if consumer == "" {
		return nil, errors.New("outbox: NewInbox needs the consumer's name; consumer is empty")
	}
	if err := (idem.Key{Scope: inboxScope + consumer, ID: "x"}).Validate(); err != nil {
		return nil, fmt.Errorf("outbox: the consumer's name %q cannot be used: %w", consumer, err)
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultInboxTTL
	}
	b := &Inbox{db: db, consumer: consumer, opts: []idem.Option{idem.Schema(opts.Schema), idem.TTL(ttl),
		idem.TracerProvider(opts.TracerProvider), idem.MeterProvider(opts.MeterProvider)}}
	if opts.MaxAttempts != 0 {
		b.opts = append(b.opts, idem.MaxAttempts(opts.MaxAttempts))
		b.txOpts = append(b.txOpts, tx.MaxAttempts(opts.MaxAttempts))
	}
	if opts.Isolation != "" {
		b.opts = append(b.opts, idem.Isolation(opts.Isolation))
		b.txOpts = append(b.txOpts, tx.Isolation(opts.Isolation))
	}
	if err := idem.CheckOptions(b.opts...); err != nil {
		return nil, fmt.Errorf("outbox: InboxOpts: %w", err)
	}
	return b, nil
}

// Handle runs fn for the message with id messageID, unless this consumer handled it before. It
// reports whether fn ran now; nil error either way means the message is handled (the
// transaction committed, now or before) and should be acknowledged. fn gets the transaction
// that records the message; everything it writes commits with that record or not at all.
//
// On an error, nothing was recorded: do not acknowledge, and let the broker deliver the message
// again (a negative acknowledgement with a delay, or the ack wait running out). The error is
// fn's own, an error of the database, idem.ErrInFlight when the same message is being handled
// right now by another delivery, or idem.ErrInvalidKey when messageID is empty or not printable
// ASCII (at most 255 bytes): a message without a usable id cannot be deduplicated.
//
//	ran, err := inbox.Handle(ctx, delivery.MessageId, func(ctx context.Context, t pgx.Tx) error {
//		_, err := t.Exec(ctx, `INSERT INTO ledger (ref, amount) VALUES ($1, $2)`, ref, amount)
//		return err
//	})
func (b *Inbox) Handle(ctx context.Context, messageID string, fn func(ctx context.Context, tx pgx.Tx) error) (bool, error) {
	if fn == nil {
		return false, errors.New("outbox: Inbox.Handle needs a function; fn is nil")
	}
	key := idem.Key{Scope: inboxScope + b.consumer, ID: messageID}
	if err := key.Validate(); err != nil {
		return false, fmt.Errorf("outbox: the message's id cannot key the inbox: %w", err)
	}
	var ran bool
	err := tx.Run(ctx, b.db, func(ctx context.Context, t pgx.Tx) error {
		ran = false // a retry of the transaction may replay what another delivery committed
		_, err := idem.Do(ctx, t, key, func(ctx context.Context, t pgx.Tx) (struct{}, error) {
			ran = true
			return struct{}{}, fn(ctx, t)
		}, b.opts...)
		return err
	}, b.txOpts...)
	if err != nil {
		return false, err
	}
	return ran, nil
}
