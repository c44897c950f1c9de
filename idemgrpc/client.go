package idemgrpc

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/internal/backoff"
)

// Defaults used for the zero values of [ClientConfig].
const (
	DefaultMaxAttempts   = 5
	DefaultMinBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff    = 5 * time.Second
	DefaultMaxRetryDelay = 30 * time.Second
)

// ClientConfig configures [UnaryClientInterceptor]. Methods is required; every other zero value
// means the default named on the field.
//
//	intercept, err := idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientConfig{
//		Methods:     []string{"/bank.v1.Bank/Transfer"},
//		MaxAttempts: 8,
//	})
type ClientConfig struct {
	// Methods names the unary methods that get a key and are retried, in the form of
	// Config.Methods ("/bank.v1.Bank/Transfer" or "/bank.v1.Bank/*"), and checked the same way
	// at setup: the service must be registered, and a streaming method is refused. Calls of
	// other methods go to the invoker once, untouched. Required.
	Methods []string

	// ExceptMethods leaves out methods that Methods includes.
	ExceptMethods []string

	// KeyMetadata and ReplayedMetadata name the metadata. Defaults: [DefaultKeyMetadata] and
	// [DefaultReplayedMetadata].
	KeyMetadata      string
	ReplayedMetadata string

	// NewKey makes a key for a call without one. Default: a UUIDv7, which keeps the server's
	// key index in insertion order.
	NewKey func() string

	// MaxAttempts bounds the attempts per call, the first included. Default:
	// [DefaultMaxAttempts]; 1 turns retrying off (keys are still added).
	MaxAttempts int

	// MinBackoff and MaxBackoff bound the wait before a retry: a random time up to
	// MinBackoff·2^(n-1), capped at MaxBackoff ("full jitter"). Defaults: [DefaultMinBackoff]
	// and [DefaultMaxBackoff].
	MinBackoff, MaxBackoff time.Duration

	// MaxRetryDelay is the longest RetryInfo delay honoured; an error asking for a longer wait is
	// returned to the caller instead. Default: [DefaultMaxRetryDelay].
	MaxRetryDelay time.Duration
}

// UnaryClientInterceptor returns a gRPC unary client interceptor that gives each call of the
// methods it keys an idempotency key, and retries the call with the same key until it gets an
// answer. It is the client half of [UnaryServerInterceptor], and works with any server that
// reads the key from the same metadata.
//
// A call without idempotency-key metadata gets a new UUIDv7 key. A call that has one keeps it:
// set it yourself (metadata.AppendToOutgoingContext) when the logical operation outlives one
// call, a job that a queue may run again for example.
//
// It retries on Unavailable (which includes a connection lost before the answer arrived),
// Aborted (another call with the key is still running) and ResourceExhausted, waiting as the
// error's RetryInfo says or, without it, a random time up to MinBackoff·2^(n-1) capped at
// MaxBackoff ("full jitter"); never less than that backoff, so a RetryInfo of zero does not turn
// into back-to-back calls. It never retries an answer whose header says idempotent-replayed:
// true, whatever its code: that is the final answer to the call, and asking again would get it
// again. It stops after MaxAttempts, when the call's context is done, or when the wait would end
// past the call's deadline, and returns the last attempt's error as it came, so status.Code and
// the error's details work as usual.
//
// The caller's metadata and call options are never modified: the key is added to a context of
// its own. The reply message is reset before each retry.
//
//	intercept, err := idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientConfig{
//		Methods: []string{"/bank.v1.Bank/Transfer"},
//	})
//	if err != nil {
//		return err
//	}
//	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds),
//		grpc.WithChainUnaryInterceptor(intercept))
func UnaryClientInterceptor(cfg *ClientConfig) (grpc.UnaryClientInterceptor, error) {
	if cfg == nil {
		return nil, fmt.Errorf("idemgrpc: ClientConfig cannot be nil: Methods is required")
	}
	c := &client{ClientConfig: *cfg}
	var err error
	if c.methods, err = resolveMethods(c.Methods, c.ExceptMethods); err != nil {
		return nil, err
	}
	if c.KeyMetadata, err = metadataName("KeyMetadata", c.KeyMetadata, DefaultKeyMetadata); err != nil {
		return nil, err
	}
	if c.ReplayedMetadata, err = metadataName("ReplayedMetadata", c.ReplayedMetadata, DefaultReplayedMetadata); err != nil {
		return nil, err
	}
	if c.NewKey == nil {
		c.NewKey = func() string { return uuid.Must(uuid.NewV7()).String() }
	}
	for _, d := range []struct {
		field string
		v     *time.Duration
		def   time.Duration
	}{
		{"MinBackoff", &c.MinBackoff, DefaultMinBackoff},
		{"MaxBackoff", &c.MaxBackoff, DefaultMaxBackoff},
		{"MaxRetryDelay", &c.MaxRetryDelay, DefaultMaxRetryDelay},
	} {
		if *d.v < 0 {
			return nil, fmt.Errorf("idemgrpc: %s cannot be negative (got %s)", d.field, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.MaxBackoff < c.MinBackoff {
		return nil, fmt.Errorf("idemgrpc: MaxBackoff cannot be less than MinBackoff (got %s and %s)", c.MaxBackoff, c.MinBackoff)
	}
	if c.MaxAttempts < 0 {
		return nil, fmt.Errorf("idemgrpc: MaxAttempts cannot be negative (got %d)", c.MaxAttempts)
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	return c.intercept, nil
}

type client struct {
	ClientConfig
	methods map[string]*method
}

func (c *client) intercept(ctx context.Context, fullMethod string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if _, ok := c.methods[fullMethod]; !ok {
		return invoker(ctx, fullMethod, req, reply, cc, opts...)
	}
	// FromOutgoingContext returns a copy; the caller's metadata is only read.
	md, _ := metadata.FromOutgoingContext(ctx)
	if len(md.Get(c.KeyMetadata)) == 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, c.KeyMetadata, c.NewKey())
	}
	jitter := backoff.Jitter{Min: c.MinBackoff, Max: c.MaxBackoff}
	for attempt := 1; ; attempt++ {
		var header metadata.MD
		aopts := append(slices.Clip(opts), grpc.Header(&header))
		err := invoker(ctx, fullMethod, req, reply, cc, aopts...)
		wait, retry := c.retryable(ctx, err, header, attempt, jitter)
		if !retry || attempt >= c.MaxAttempts {
			return err
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
			return err // the next attempt could only start after the call has expired
		}
		if backoff.Sleep(ctx, wait) != nil {
			return err
		}
		if m, ok := reply.(proto.Message); ok {
			proto.Reset(m)
		}
	}
}

// retryable decides whether an attempt's outcome calls for another attempt, and after how long.
func (c *client) retryable(ctx context.Context, err error, header metadata.MD, attempt int, jitter backoff.Jitter) (time.Duration, bool) {
	if err == nil || ctx.Err() != nil || slices.Contains(header.Get(c.ReplayedMetadata), "true") {
		return 0, false
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable, codes.Aborted, codes.ResourceExhausted:
	default:
		return 0, false
	}
	wait := jitter.Wait(attempt)
	if d, ok := retryDelay(st); ok {
		if d > c.MaxRetryDelay {
			return 0, false
		}
		wait = max(wait, d)
	}
	return wait, true
}
