package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/natspub"
)

// A variant is one way of getting messages from a transaction to JetStream: idem's outbox, or
// watermill-sql's publisher and watermill's forwarder.
type variant interface {
	name() string
	// setup makes what the variant needs in the database.
	setup(ctx context.Context, pool *pgxpool.Pool) error
	// appendTx writes msgs in t; the ids are recorded for latencies.
	appendTx(ctx context.Context, t pgx.Tx, msgs []benchMsg) error
	// start starts relaying to js, reporting each acknowledged message to ack, until ctx ends.
	start(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, ack func(id string)) (wait func(), err error)
}

type benchMsg struct {
	id      string
	key     string
	payload []byte
}

// idemVariant is idem's outbox with its defaults (RelayOpts nil but for the logger).
type idemVariant struct {
	relays int
}

func (v idemVariant) name() string {
	if v.relays > 1 {
		return fmt.Sprintf("idem (%d relays)", v.relays)
	}
	return "idem"
}

func (idemVariant) setup(context.Context, *pgxpool.Pool) error { return nil }

func (idemVariant) appendTx(ctx context.Context, t pgx.Tx, msgs []benchMsg) error {
	batch := make([]outbox.Message, len(msgs))
	for i, m := range msgs {
		batch[i] = outbox.Message{Topic: "bench.events", Key: m.key, Payload: m.payload, Headers: map[string]string{"Bench-Id": m.id}}
	}
	_, err := outbox.AppendBatch(ctx, t, batch)
	return err
}

func (v idemVariant) start(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, ack func(string)) (func(), error) {
	var wg sync.WaitGroup
	for i := range max(v.relays, 1) {
		relay, err := outbox.NewRelay(pool, &countingPublisher{inner: natspub.New(js, nil), ack: ack},
			&outbox.RelayOpts{Name: fmt.Sprintf("bench-%d", i), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, err
		}
		wg.Go(func() { _ = relay.Run(ctx) })
	}
	return wg.Wait, nil
}

// countingPublisher reports each message the broker acknowledged, when the relay learns it.
type countingPublisher struct {
	inner outbox.Publisher
	ack   func(id string)
}

func (p *countingPublisher) Publish(ctx context.Context, batch []*outbox.Envelope) []error {
	errs := p.inner.Publish(ctx, batch)
	for i, e := range batch {
		if errs == nil || errs[i] == nil {
			p.ack(e.Headers["Bench-Id"])
		}
	}
	return errs
}

// watermillVariant is watermill-sql's publisher in the transaction and watermill's forwarder
// from the SQL table to JetStream, publishing each message with its UUID as Nats-Msg-Id and
// waiting for the PubAck.
type watermillVariant struct {
	tuned bool // poll every 10ms, read 1,000 at a time; else the defaults (1s, 100)
}

func (v watermillVariant) name() string {
	if v.tuned {
		return "watermill (tuned)"
	}
	return "watermill (defaults)"
}

const forwarderTopic = "forwarder"

func (v watermillVariant) schema() wsql.DefaultPostgreSQLSchema {
	s := wsql.DefaultPostgreSQLSchema{}
	if v.tuned {
		s.SubscribeBatchSize = 1000
	}
	return s
}

func (v watermillVariant) setup(ctx context.Context, pool *pgxpool.Pool) error {
	sub, err := v.subscriber(pool)
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(forwarderTopic)
}

func (v watermillVariant) subscriber(pool *pgxpool.Pool) (*wsql.Subscriber, error) {
	cfg := wsql.SubscriberConfig{SchemaAdapter: v.schema(), OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true}
	if v.tuned {
		cfg.PollInterval = 10 * time.Millisecond
	}
	return wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), cfg, watermill.NopLogger{})
}

func (v watermillVariant) appendTx(ctx context.Context, t pgx.Tx, msgs []benchMsg) error {
	pub, err := wsql.NewPublisher(wsql.TxFromPgx(t), wsql.PublisherConfig{SchemaAdapter: v.schema()}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	wm := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		wm[i] = message.NewMessage(m.id, m.payload)
		wm[i].SetContext(ctx)
		wm[i].Metadata.Set("key", m.key)
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic}).Publish("bench.events", wm...)
}

func (v watermillVariant) start(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, ack func(string)) (func(), error) {
	sub, err := v.subscriber(pool)
	if err != nil {
		return nil, err
	}
	fwd, err := forwarder.NewForwarder(sub, &jetStreamPublisher{js: js, ack: ack}, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: forwarderTopic})
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = fwd.Run(ctx)
	}()
	return func() { <-done; _ = fwd.Close() }, nil
}

// jetStreamPublisher is a watermill publisher to JetStream: the message's UUID is its
// Nats-Msg-Id, and Publish returns once JetStream acknowledged it.
type jetStreamPublisher struct {
	js  jetstream.JetStream
	ack func(id string)
}

func (p *jetStreamPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		nm := nats.NewMsg(topic)
		nm.Data = m.Payload
		for k, v := range m.Metadata {
			nm.Header.Set(k, v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := p.js.PublishMsg(ctx, nm, jetstream.WithMsgID(m.UUID))
		cancel()
		if err != nil {
			return err
		}
		p.ack(m.UUID)
	}
	return nil
}

func (p *jetStreamPublisher) Close() error { return nil }

func newID() string { return uuid.Must(uuid.NewV7()).String() }
