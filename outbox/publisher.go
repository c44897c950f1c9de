package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Headers idem's publishers add to every message, beside the broker's own id field (NATS's
// Nats-Msg-Id, AMQP's message_id): the message's id, its key and its sequence number within the
// key, so that a consumer can deduplicate and check order without knowing the broker.
const (
	HeaderID  = "Idem-Message-Id"
	HeaderKey = "Idem-Key"
	HeaderSeq = "Idem-Seq"
)

// Envelope is a message as the relay hands it to a [Publisher]: what was appended, with the id
// and the key's sequence number it got.
//
//	func publish(ctx context.Context, e *outbox.Envelope) error {
//		return send(ctx, e.Topic, e.ID.String(), e.Payload)
//	}
type Envelope struct {
	ID      uuid.UUID // the same on every attempt: the broker's and the inbox's deduplication id
	Topic   string
	Key     string // "" for a message without a key
	Seq     int64  // the key's sequence number, from 1; 0 without a key
	Payload []byte
	Headers map[string]string // as appended; nil for none
	Created time.Time         // when it was appended, by the database's clock
	Attempt int               // 1 on the first attempt
}

// Publisher sends messages to a broker. Publish sends batch and reports the fate of each
// message: it returns nil when the broker acknowledged every one, or a slice as long as batch
// in which errs[i] is nil for each message the broker acknowledged (stored durably, as far as
// the broker promises: a JetStream PubAck, an AMQP publisher confirm, a Kafka produce
// response). A message the broker refuses is an error, never a silent success: the relay then
// applies its failure policy. Wrap an error that says the broker cannot be reached at all with
// [Unavailable], so that the relay waits for the broker instead of counting it against the
// messages.
//
// A batch holds at most one message per key (the relay waits for a key's acknowledgement before
// it publishes the key's next message), so the publisher may send the batch in any order, and
// should send it all at once. Publish must return by ctx's deadline. The publishers in
// outbox/natspub, outbox/amqppub and outbox/kafkapub implement it; [PublisherFunc] makes one of
// a function that sends a single message.
//
//	var _ outbox.Publisher = natspub.New(js, nil)
type Publisher interface {
	Publish(ctx context.Context, batch []*Envelope) []error
}

// PublisherFunc is a [Publisher] made of a function that sends one message and returns once the
// broker has acknowledged it. Publish calls it for the messages of a batch concurrently, at most
// 64 at a time.
//
//	pub := outbox.PublisherFunc(func(ctx context.Context, e *outbox.Envelope) error {
//		return broker.SendAndWait(ctx, e.Topic, e.ID.String(), e.Payload)
//	})
type PublisherFunc func(ctx context.Context, e *Envelope) error

// Publish implements [Publisher].
func (f PublisherFunc) Publish(ctx context.Context, batch []*Envelope) []error {
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i, e := range batch {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(ctx, e)
		})
	}
	wg.Wait()
	return errs
}

// ErrUnavailable means the broker could not be reached (down, restarting, a network partition),
// as opposed to a broker that refused a message. Publishers wrap such errors with
// [Unavailable]; the relay then pauses all publishing and tries again with backoff, and does
// not count the attempt against the messages, so that an outage does not stop every key.
//
//	if errors.Is(err, outbox.ErrUnavailable) { ... }
var ErrUnavailable = errors.New("outbox: the broker is unavailable")

// Unavailable marks err as the broker being unreachable; see [ErrUnavailable].
//
//	if errors.Is(err, nats.ErrConnectionClosed) {
//		return outbox.Unavailable(err)
//	}
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &unavailableError{err: err}
}

type unavailableError struct{ err error }

func (e *unavailableError) Error() string {
	return fmt.Sprintf("outbox: the broker is unavailable: %v", e.err)
}
func (e *unavailableError) Unwrap() error        { return e.err }
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }
