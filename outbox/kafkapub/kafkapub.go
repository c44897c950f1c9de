// Package kafkapub publishes the outbox's messages to Kafka with franz-go's idempotent producer
// (its default): the record's key is the message's key, so a key's messages go to one partition
// in order, and the message's id travels in the Idem-Message-Id header, on which consumers (and
// the outbox's inbox) deduplicate. A message counts as published once the broker acknowledged
// it with the client's acks setting (all in-sync replicas by default). A record the broker
// refuses (an unknown topic, a record too large) is a failure that goes through the relay's
// failure policy.
//
// It is a module of its own, so that idem's module requires no Kafka client.
//
//	cl, err := kgo.NewClient(kgo.SeedBrokers("localhost:9092"))
//	relay, err := outbox.NewRelay(pool, kafkapub.New(cl, nil), nil)
package kafkapub

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/outbox"
)

// Opts configure a [Publisher]; nil means the defaults.
//
//	pub := kafkapub.New(cl, &kafkapub.Opts{Topic: func(topic string) string { return "prod." + topic }})
type Opts struct {
	// Topic maps a message's topic to the Kafka topic. The default is the topic itself.
	Topic func(topic string) string
}

// Publisher is an [outbox.Publisher] for Kafka.
//
//	pub := kafkapub.New(cl, nil)
type Publisher struct {
	cl    *kgo.Client
	topic func(string) string
}

// New returns a publisher that produces with cl. Keep cl's idempotent writes on (franz-go's
// default), so that the client's own retries do not store a record twice.
//
//	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
//	pub := kafkapub.New(cl, nil)
func New(cl *kgo.Client, opts *Opts) *Publisher {
	p := &Publisher{cl: cl, topic: func(t string) string { return t }}
	if opts != nil && opts.Topic != nil {
		p.topic = opts.Topic
	}
	return p
}

// Publish implements [outbox.Publisher]: it produces the batch at once and waits for each
// record's acknowledgement.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Envelope) []error {
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	for i, e := range batch {
		r := &kgo.Record{Topic: p.topic(e.Topic), Value: e.Payload, Timestamp: e.Created,
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderID, Value: []byte(e.ID.String())}}}
		if e.Key != "" {
			r.Key = []byte(e.Key)
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderKey, Value: []byte(e.Key)},
				kgo.RecordHeader{Key: outbox.HeaderSeq, Value: []byte(strconv.FormatInt(e.Seq, 10))})
		}
		for k, v := range e.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		wg.Add(1)
		p.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			errs[i] = classify(err)
			wg.Done()
		})
	}
	wg.Wait()
	return errs
}

// classify marks the errors of a cluster that cannot be reached, which the relay waits out,
// apart from those about the record, which count against it.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.InvalidTopicException):
		return err
	case errors.Is(err, kgo.ErrClientClosed), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, kgo.ErrRecordTimeout), kerr.IsRetriable(err):
		return outbox.Unavailable(err)
	}
	return err
}
