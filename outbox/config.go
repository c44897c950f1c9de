package outbox

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of [RelayOpts] and [FailurePolicy].
const (
	DefaultLanes          = 16
	DefaultLease          = 10 * time.Second
	DefaultBatchSize      = 500
	DefaultMaxInFlight    = 4
	DefaultMaxPending     = 20000
	DefaultPollInterval   = 100 * time.Millisecond
	DefaultPublishTimeout = 30 * time.Second
	DefaultMaxAttempts    = 10
	DefaultMinBackoff     = 200 * time.Millisecond
	DefaultMaxBackoff     = time.Minute
)

// RelayOpts configure a [Relay]. A nil *RelayOpts, and every zero field, means the default.
//
//	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayOpts{
//		Failure: &outbox.FailurePolicy{MaxAttempts: 5},
//		Topics:  map[string]*outbox.FailurePolicy{"audit.event": {DeadLetter: true}},
//	})
type RelayOpts struct {
	// Schema is the Postgres schema of idem's tables, as given to idem.Migrate.
	Schema string

	// Name identifies this relay in the lanes table (for operators) and among the live relays.
	// Every relay needs its own. The default is the host name, the process id and a random
	// suffix.
	Name string

	// Lanes is how many lanes the keys are spread over (hash of the key modulo Lanes), which
	// bounds how many relays can share the work. The first relay to start on a database sets
	// it; every later relay must give the same number, or 0 to take what is there. The default
	// is DefaultLanes.
	Lanes int

	// Lease is how long a relay owns its lanes without renewing them; it renews them about
	// every second. When a relay dies, its lanes move to the others within Lease and a second
	// or two. At least one second; the default is DefaultLease.
	Lease time.Duration

	// BatchSize is the most messages handed to the publisher at once (at most one per key).
	// The default is DefaultBatchSize.
	BatchSize int

	// MaxInFlight is the most batches being published at once. The default is
	// DefaultMaxInFlight.
	MaxInFlight int

	// MaxPending is the most messages the relay holds in memory; it reads no more until it
	// has published some. The default is DefaultMaxPending.
	MaxPending int

	// PollInterval is the longest the relay waits between two reads when it finds nothing new.
	// It reads again at once while it finds messages, backs off from a millisecond when it
	// does not, and looks at once when a transaction of this process appends a message. The
	// default is DefaultPollInterval.
	PollInterval time.Duration

	// PublishTimeout bounds one call of the publisher. The default is DefaultPublishTimeout.
	PublishTimeout time.Duration

	// Failure is what happens when the broker refuses a message, for every topic not in
	// Topics. nil means the defaults of FailurePolicy.
	Failure *FailurePolicy

	// Topics are failure policies by topic.
	Topics map[string]*FailurePolicy

	// Logger receives a warning when a key stops and when the broker or the database cannot
	// be reached, and debug lines about lanes. nil means slog.Default().
	Logger *slog.Logger

	// TracerProvider and MeterProvider receive a span per published batch and the relay's
	// metrics; nil means the global providers.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// FailurePolicy is what the relay does with a message the broker refuses (an error from the
// publisher that is not [ErrUnavailable]): it tries again after a backoff that doubles from
// MinBackoff up to MaxBackoff (with jitter), while the key's later messages wait; after
// MaxAttempts failed attempts it either stops the key (the default), which keeps the key's
// order, or dead-letters the message and goes on with the key's next one.
//
// A stopped key stays stopped until an operator acts, with [Retry] (after fixing the cause) or
// [Skip], or `idem outbox retry|skip ID`; its message has status "stopped" and the relay logs a
// warning. A dead-lettered message has status "dead", is kept until an operator retries or
// skips it, and is never reaped. Other keys are not delayed by either.
//
//	policy := &outbox.FailurePolicy{MaxAttempts: 20, MaxBackoff: 5 * time.Minute}
type FailurePolicy struct {
	MaxAttempts int           // default DefaultMaxAttempts
	MinBackoff  time.Duration // default DefaultMinBackoff
	MaxBackoff  time.Duration // default DefaultMaxBackoff
	DeadLetter  bool          // after MaxAttempts: set the message aside and go on, instead of stopping the key
}

// relayConfig is RelayOpts checked, with the defaults filled in.
type relayConfig struct {
	RelayOpts
	failure FailurePolicy
	topics  map[string]FailurePolicy
}

func newRelayConfig(o *RelayOpts) (*relayConfig, error) {
	c := &relayConfig{}
	if o != nil {
		c.RelayOpts = *o
	}
	if len(c.Schema) > 63 {
		return nil, fmt.Errorf("outbox: RelayOpts.Schema cannot be longer than 63 bytes (got %q)", c.Schema)
	}
	if c.Name == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "relay"
		}
		c.Name = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	ints := []struct {
		v    *int
		name string
		def  int
		min  int
	}{
		{&c.Lanes, "Lanes", 0, 1},
		{&c.BatchSize, "BatchSize", DefaultBatchSize, 1},
		{&c.MaxInFlight, "MaxInFlight", DefaultMaxInFlight, 1},
		{&c.MaxPending, "MaxPending", DefaultMaxPending, 1},
	}
	for _, i := range ints {
		switch {
		case *i.v < 0:
			return nil, fmt.Errorf("outbox: RelayOpts.%s cannot be negative (got %d)", i.name, *i.v)
		case *i.v == 0:
			*i.v = i.def
		case *i.v < i.min:
			return nil, fmt.Errorf("outbox: RelayOpts.%s must be at least %d (got %d)", i.name, i.min, *i.v)
		}
	}
	if c.Lanes > 4096 {
		return nil, fmt.Errorf("outbox: RelayOpts.Lanes cannot be more than 4096 (got %d)", c.Lanes)
	}
	if c.MaxPending < c.BatchSize {
		return nil, fmt.Errorf("outbox: RelayOpts.MaxPending (%d) cannot be less than BatchSize (%d)", c.MaxPending, c.BatchSize)
	}
	durs := []struct {
		v    *time.Duration
		name string
		def  time.Duration
		min  time.Duration
	}{
		{&c.Lease, "Lease", DefaultLease, time.Second},
		{&c.PollInterval, "PollInterval", DefaultPollInterval, time.Millisecond},
		{&c.PublishTimeout, "PublishTimeout", DefaultPublishTimeout, time.Millisecond},
	}
	for _, d := range durs {
		if err := durOpt(d.v, "RelayOpts."+d.name, d.def, d.min); err != nil {
			return nil, err
		}
	}
	var err error
	if c.failure, err = checkPolicy(c.Failure, "RelayOpts.Failure"); err != nil {
		return nil, err
	}
	c.topics = map[string]FailurePolicy{}
	for topic, p := range c.Topics {
		if c.topics[topic], err = checkPolicy(p, fmt.Sprintf("RelayOpts.Topics[%q]", topic)); err != nil {
			return nil, err
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

func durOpt(v *time.Duration, name string, def, min time.Duration) error {
	switch {
	case *v == 0:
		*v = def
	case *v < min:
		return fmt.Errorf("outbox: %s cannot be less than %s (got %s)", name, min, *v)
	}
	return nil
}

func checkPolicy(p *FailurePolicy, name string) (FailurePolicy, error) {
	var out FailurePolicy
	if p != nil {
		out = *p
	}
	switch {
	case out.MaxAttempts < 0:
		return out, fmt.Errorf("outbox: %s.MaxAttempts cannot be negative (got %d)", name, out.MaxAttempts)
	case out.MaxAttempts == 0:
		out.MaxAttempts = DefaultMaxAttempts
	}
	if err := durOpt(&out.MinBackoff, name+".MinBackoff", DefaultMinBackoff, time.Millisecond); err != nil {
		return out, err
	}
	if err := durOpt(&out.MaxBackoff, name+".MaxBackoff", max(DefaultMaxBackoff, out.MinBackoff), time.Millisecond); err != nil {
		return out, err
	}
	if out.MaxBackoff < out.MinBackoff {
		return out, fmt.Errorf("outbox: %s.MaxBackoff (%s) cannot be less than MinBackoff (%s)", name, out.MaxBackoff, out.MinBackoff)
	}
	return out, nil
}

// policy returns the failure policy of topic.
func (c *relayConfig) policy(topic string) FailurePolicy {
	if p, ok := c.topics[topic]; ok {
		return p
	}
	return c.failure
}
