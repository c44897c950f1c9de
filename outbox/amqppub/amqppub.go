// Package amqppub publishes the outbox's messages to RabbitMQ (AMQP 0-9-1) with publisher
// confirms: a message counts as published once the broker has confirmed it (after it routed the
// message to every queue that should have it, and wrote it to disk for a durable queue). It is
// published mandatory, so a message no queue takes comes back, and counts as a failure, never as
// published; a negative confirmation, or a channel the broker closed over the message (an
// exchange that does not exist), is a failure too. Each message carries its id as message_id
// and is persistent.
//
// It is a module of its own, so that idem's module requires no AMQP client.
//
//	pub := amqppub.New(func() (*amqp.Connection, error) { return amqp.Dial(url) }, nil)
//	relay, err := outbox.NewRelay(pool, pub, nil)
package amqppub

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/outbox"
)

// Dialer opens a connection to the broker; the publisher calls it at first use and again
// whenever the connection was lost.
type Dialer func() (*amqp.Connection, error)

// Opts configure a [Publisher]; nil means the defaults.
//
//	pub := amqppub.New(dial, &amqppub.Opts{Exchange: "events"})
type Opts struct {
	// Exchange is where messages are published; the topic is the routing key. The default, "",
	// is the default exchange, which routes a message to the queue named by its topic.
	Exchange string

	// Route, when set, maps a topic to the exchange and routing key instead.
	Route func(topic string) (exchange, key string)
}

// returnsChunk is how many messages go out before the publisher waits for their confirmations;
// their returned messages must fit in the channel that collects them.
const returnsChunk = 1024

// Publisher is an [outbox.Publisher] for RabbitMQ. It publishes one batch at a time on one
// channel in confirm mode, and opens a new channel (or connection) when the broker closed the
// last one.
//
//	pub := amqppub.New(func() (*amqp.Connection, error) { return amqp.Dial(url) }, nil)
type Publisher struct {
	dial  Dialer
	route func(topic string) (string, string)

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
	reason  *amqp.Error // why the broker closed the channel
}

// New returns a publisher that connects with dial.
//
//	pub := amqppub.New(func() (*amqp.Connection, error) { return amqp.Dial("amqp://guest:guest@localhost:5672/") }, nil)
func New(dial Dialer, opts *Opts) *Publisher {
	p := &Publisher{dial: dial}
	var exchange string
	if opts != nil {
		exchange = opts.Exchange
		p.route = opts.Route
	}
	if p.route == nil {
		p.route = func(topic string) (string, string) { return exchange, topic }
	}
	return p
}

// Close closes the publisher's connection.
//
//	defer pub.Close()
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	err := p.conn.Close()
	p.conn, p.ch = nil, nil
	return err
}

// channel returns the confirm-mode channel, opening what the broker closed.
func (p *Publisher) channel() (*amqp.Channel, error) {
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := p.dial()
		if err != nil {
			return nil, outbox.Unavailable(fmt.Errorf("amqppub: error connecting: %w", err))
		}
		p.conn = conn
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, outbox.Unavailable(fmt.Errorf("amqppub: error opening a channel: %w", err))
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, outbox.Unavailable(fmt.Errorf("amqppub: error putting the channel in confirm mode: %w", err))
	}
	p.returns = ch.NotifyReturn(make(chan amqp.Return, returnsChunk))
	p.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	p.reason = nil
	p.ch = ch
	return ch, nil
}

// Publish implements [outbox.Publisher].
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Envelope) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(batch))
	for start := 0; start < len(batch); start += returnsChunk {
		end := min(start+returnsChunk, len(batch))
		p.publish(ctx, batch[start:end], errs[start:end])
	}
	return errs
}

func (p *Publisher) publish(ctx context.Context, batch []*outbox.Envelope, errs []error) {
	ch, err := p.channel()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return
	}
	confirms := make([]*amqp.DeferredConfirmation, len(batch))
	for i, e := range batch {
		exchange, key := p.route(e.Topic)
		headers := amqp.Table{outbox.HeaderID: e.ID.String()}
		for k, v := range e.Headers {
			headers[k] = v
		}
		if e.Key != "" {
			headers[outbox.HeaderKey] = e.Key
			headers[outbox.HeaderSeq] = strconv.FormatInt(e.Seq, 10)
		}
		msg := amqp.Publishing{MessageId: e.ID.String(), DeliveryMode: amqp.Persistent, Timestamp: e.Created,
			Headers: headers, Body: e.Payload, ContentType: e.Headers["Content-Type"]}
		confirms[i], errs[i] = ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
		if errs[i] != nil {
			errs[i] = p.failure(fmt.Errorf("amqppub: error publishing: %w", errs[i]))
		}
	}
	for i, c := range confirms {
		if c == nil {
			continue
		}
		ack, err := c.WaitContext(ctx)
		switch {
		case err != nil:
			errs[i] = outbox.Unavailable(fmt.Errorf("amqppub: no confirmation: %w", err))
		case !ack:
			errs[i] = p.failure(errors.New("amqppub: the broker did not confirm the message (nack)"))
		}
	}
	// A returned message comes before its confirmation, so every return of this chunk is here
	// (the channel of returns is closed when the broker closed the channel).
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				return
			}
			for i, e := range batch {
				if errs[i] == nil && e.ID.String() == r.MessageId {
					errs[i] = fmt.Errorf("amqppub: the broker returned the message as unroutable (%d %s): no queue is bound to exchange %q for routing key %q",
						r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey)
				}
			}
			continue
		default:
		}
		break
	}
}

// failure says why the channel went, if the broker closed it over a message (an exchange that
// does not exist, say); a connection that went is the broker being unavailable.
func (p *Publisher) failure(err error) error {
	select {
	case reason, ok := <-p.closed:
		if ok && reason != nil {
			p.reason = reason
		}
	default:
	}
	switch {
	case p.conn == nil || p.conn.IsClosed():
		return outbox.Unavailable(err)
	case p.reason != nil:
		return fmt.Errorf("%w: the broker closed the channel: %v", err, p.reason)
	}
	return err
}
