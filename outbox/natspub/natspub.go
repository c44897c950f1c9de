// Package natspub publishes the outbox's messages to NATS JetStream: each message goes to the
// subject named by its topic, with its id as Nats-Msg-Id, and counts as published once JetStream
// has answered with a PubAck, which it sends after the stream stored the message. A PubAck that
// says the message is a duplicate counts as published too: JetStream has it already.
//
// It is a module of its own, so that idem's module requires no NATS client.
//
//	nc, err := nats.Connect(url)
//	js, err := jetstream.New(nc)
//	relay, err := outbox.NewRelay(pool, natspub.New(js, nil), nil)
//
// # Streams and the duplicate window
//
// The subjects must belong to a stream: a message to a subject no stream captures gets no
// PubAck ("no response from stream"), and goes through the relay's failure policy, like any
// message JetStream refuses (one larger than its max_payload, say). Nothing is dropped quietly.
//
// JetStream deduplicates on Nats-Msg-Id within the stream's duplicate window (its Duplicates
// setting, two minutes by default): a message the relay publishes again inside the window
// (after a relay died between the PubAck and its own record of it) is answered with a duplicate
// PubAck and stored once. Past the window, JetStream stores it a second time, under the same id;
// a consumer that handles messages through an outbox.Inbox, which deduplicates on the id for
// days, does nothing the second time. Set the window longer than your relays take to come back,
// or rely on the inbox.
package natspub

import (
	"context"
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/outbox"
)

// Opts configure a [Publisher]; nil means the defaults.
//
//	pub := natspub.New(js, &natspub.Opts{Subject: func(topic string) string { return "events." + topic }})
type Opts struct {
	// Subject maps a message's topic to the subject it is published to. The default is the
	// topic itself.
	Subject func(topic string) string
}

// Publisher is an [outbox.Publisher] for NATS JetStream.
//
//	relay, err := outbox.NewRelay(pool, natspub.New(js, nil), nil)
type Publisher struct {
	js      jetstream.JetStream
	subject func(string) string
}

// New returns a publisher that publishes through js.
//
//	js, err := jetstream.New(nc)
//	pub := natspub.New(js, nil)
func New(js jetstream.JetStream, opts *Opts) *Publisher {
	p := &Publisher{js: js, subject: func(topic string) string { return topic }}
	if opts != nil && opts.Subject != nil {
		p.subject = opts.Subject
	}
	return p
}

// Publish implements [outbox.Publisher]: it publishes the whole batch asynchronously and then
// waits for each PubAck, until ctx ends.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Envelope) []error {
	errs := make([]error, len(batch))
	futures := make([]jetstream.PubAckFuture, len(batch))
	for i, e := range batch {
		id := e.ID.String()
		msg := nats.NewMsg(p.subject(e.Topic))
		msg.Data = e.Payload
		for k, v := range e.Headers {
			msg.Header.Set(k, v)
		}
		msg.Header.Set(outbox.HeaderID, id)
		if e.Key != "" {
			msg.Header.Set(outbox.HeaderKey, e.Key)
			msg.Header.Set(outbox.HeaderSeq, strconv.FormatInt(e.Seq, 10))
		}
		futures[i], errs[i] = p.js.PublishMsgAsync(msg, jetstream.WithMsgID(id))
		errs[i] = classify(errs[i])
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
			// A duplicate PubAck too: the stream has the message from an earlier attempt.
		case err := <-f.Err():
			errs[i] = classify(err)
		case <-ctx.Done():
			errs[i] = outbox.Unavailable(ctx.Err())
		}
	}
	return errs
}

// classify marks the errors of a broker that cannot be reached, which the relay waits out, apart
// from those about the message, which count against it.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrAsyncPublishTimeout),
		errors.Is(err, jetstream.ErrTooManyStalledMsgs), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return outbox.Unavailable(err)
	}
	return err
}
