package idem

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/redact"
)

// DefaultTTL is how long a completed key is remembered when no [TTL] option is given.
const DefaultTTL = 24 * time.Hour

// Option configures [Do], [Run] and [Migrate]. Options that do not apply to a function are
// ignored by it. An invalid option makes the call fail before any SQL, with an error that names
// the option.
//
//	opts := []idem.Option{idem.TTL(72 * time.Hour), idem.Wait(time.Second)}
//	out, err := idem.Do(ctx, tx, key, fn, opts...)
type Option func(*config)

type config struct {
	ttl        time.Duration
	wait       time.Duration
	retryAfter time.Duration
	schema     string
	isoLevel   pgx.TxIsoLevel
	maxTries   int
	optimistic bool
	backoff    *backoff.Jitter // Run's retries; nil: tx.Run's default

	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	log            *slog.Logger
	keys           redact.Keys

	reapMax         int64
	reapBusy        float64
	reapBatchTime   time.Duration
	outboxRetention time.Duration

	err error
}

func newConfig(opts []Option) *config {
	c := &config{ttl: DefaultTTL, retryAfter: time.Second, maxTries: 10, reapBusy: DefaultReapBusy, reapBatchTime: DefaultReapBatchTime,
		outboxRetention: DefaultOutboxRetention}
	for _, o := range opts {
		o(c)
	}
	return c
}

// CheckOptions reports the first invalid option, as [Do], [Run], [Migrate] and [Reap] would,
// without touching the database: for code that takes idem options in a configuration and
// should refuse a bad one at setup rather than on the first request.
//
//	if err := idem.CheckOptions(opts...); err != nil {
//		return nil, fmt.Errorf("idem options: %w", err)
//	}
func CheckOptions(opts ...Option) error { return newConfig(opts).err }

func (c *config) setErr(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("idem: "+format, args...)
	}
}

// TTL sets how long a completed key is remembered, and so how long a retry can replay it.
// After that the key is treated as new (and the reaper in package workflow deletes it). The
// default is [DefaultTTL]. Pick it longer than the longest time your clients keep retrying.
//
//	idem.Do(ctx, tx, key, fn, idem.TTL(7*24*time.Hour))
func TTL(d time.Duration) Option {
	return func(c *config) {
		if d < time.Second {
			c.setErr("TTL cannot be less than one second (got %s)", d)
			return
		}
		c.ttl = d
	}
}

// Wait makes a duplicate that arrives while the key is in flight wait up to d for the other
// transaction to finish, instead of failing at once with [ErrInFlight]. When the other one
// commits, the waiter replays its result; when it rolls back, the waiter runs fn itself; when d
// runs out, the waiter gets ErrInFlight. Waiting keeps the waiter's transaction (and its
// connection) open, so keep d short where connections are scarce.
//
// Under REPEATABLE READ and SERIALIZABLE the waiter's snapshot cannot see the other transaction's
// commit; its write then fails with a retryable error and the retry (tx.Run does it) replays.
//
//	idem.Do(ctx, tx, key, fn, idem.Wait(2*time.Second))
func Wait(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.setErr("Wait cannot be negative (got %s)", d)
			return
		}
		c.wait = d
	}
}

// RetryAfter sets the hint carried by [InFlightError] when another transaction holds the key.
// The default is one second.
//
//	idem.Do(ctx, tx, key, fn, idem.RetryAfter(3*time.Second))
func RetryAfter(d time.Duration) Option {
	return func(c *config) {
		if d < time.Second {
			c.setErr("RetryAfter cannot be less than one second (got %s)", d)
			return
		}
		c.retryAfter = d
	}
}

// Schema names the Postgres schema that holds idem's tables, as River's Schema setting does.
// The default, "", leaves the name unqualified so that search_path decides. Give the same
// option to [Migrate] and to every call. Schema("public") and the default take the same
// in-flight lock for a key (both reach public's tables under the default search_path); where
// search_path puts idem's tables in another schema, name it here in every call.
//
//	idem.Migrate(ctx, pool, idem.Schema("billing"))
//	idem.Do(ctx, tx, key, fn, idem.Schema("billing"))
func Schema(name string) Option {
	return func(c *config) {
		if len(name) > 63 {
			c.setErr("Schema cannot be longer than 63 bytes (got %q)", name)
			return
		}
		c.schema = name
	}
}

// Isolation sets the isolation level of the transaction that [Run] begins. Ignored by [Do],
// whose caller owns the transaction. The default is the server's (normally READ COMMITTED).
//
//	idem.Run(ctx, pool, key, fn, idem.Isolation(pgx.Serializable))
func Isolation(level pgx.TxIsoLevel) Option {
	return func(c *config) {
		switch level {
		case "", pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable, pgx.ReadUncommitted:
			c.isoLevel = level
		default:
			c.setErr("Isolation %q is not a Postgres isolation level", level)
		}
	}
}

// MaxAttempts bounds how many times [Run] runs the transaction when Postgres reports a
// serialization failure or deadlock, or the COMMIT's acknowledgement is lost. The default is 10.
//
//	idem.Run(ctx, pool, key, fn, idem.MaxAttempts(3))
func MaxAttempts(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.setErr("MaxAttempts must be at least 1 (got %d)", n)
			return
		}
		c.maxTries = n
	}
}

// Optimistic skips the lookup before fn: fn runs at once, and the key's INSERT, sent with COMMIT,
// is what detects a key used before. For callers whose retries are rare, it saves the lookup's
// statement (and, in [Do] with a transaction of its own, a round trip). The guarantees do not
// change: two effects for one key still cannot commit, and every retry still gets the first
// answer. What changes is how a duplicate is answered:
//
//   - A retry of a finished key runs fn once more, then its INSERT hits the stored key, the
//     transaction rolls back (so fn's second run leaves nothing), and the next attempt looks the
//     key up and replays. A replay costs a whole run of fn plus a second transaction.
//   - A duplicate that arrives while the key is in flight runs fn too, and then waits at its
//     INSERT for the first transaction to end (instead of getting [ErrInFlight] at once); it
//     replays the first one's answer if that committed, or stores its own if that rolled back.
//
// Choose it where retries are rare and fn is cheap to run and roll back (it holds no lock others
// wait on); keep the default where duplicates are common (clients that retry on timeouts under
// load) or fn is expensive. It needs a transaction from [tx.Run] or [Run], which retry the
// attempt that lost; elsewhere it is ignored.
//
//	receipt, err := idem.Run(ctx, pool, key, transfer, idem.Optimistic())
func Optimistic() Option {
	return func(c *config) { c.optimistic = true }
}

// ReapMax bounds how many keys one [Reap] call deletes (it may stop a batch short of it). The
// default, 0, is no bound: Reap goes on until nothing expired is left.
//
//	n, err := idem.Reap(ctx, pool, idem.ReapMax(100_000))
func ReapMax(n int64) Option {
	return func(c *config) {
		if n < 0 {
			c.setErr("ReapMax cannot be negative (got %d)", n)
			return
		}
		c.reapMax = n
	}
}

// ReapBusy sets the share of its time [Reap] spends deleting, between 0 (exclusive) and 1, when
// the database is as quiet as Reap has seen it: after a batch that took t, it rests
// t·(1-busy)/busy. When its batches cost more per row than the best one of the call (averaged
// over the last few), the traffic has the server, and the rest grows by that factor (up to 2),
// so the share falls and comes back when the traffic eases. Lower leaves more room to the traffic that writes keys; higher
// clears a backlog sooner; 1 never rests. The default is [DefaultReapBusy].
//
//	n, err := idem.Reap(ctx, pool, idem.ReapBusy(1)) // a maintenance window: no rest
func ReapBusy(busy float64) Option {
	return func(c *config) {
		if !(busy > 0 && busy <= 1) {
			c.setErr("ReapBusy must be more than 0 and at most 1 (got %g)", busy)
			return
		}
		c.reapBusy = busy
	}
}

// ReapBatchTime sets how long one batch of [Reap] should take; each batch's size is adjusted
// from the last one's measured time to approach it. Short batches hold few locks and write
// small transactions. The default is [DefaultReapBatchTime].
//
//	n, err := idem.Reap(ctx, pool, idem.ReapBatchTime(10*time.Millisecond))
func ReapBatchTime(d time.Duration) Option {
	return func(c *config) {
		if d < time.Millisecond {
			c.setErr("ReapBatchTime cannot be less than a millisecond (got %s)", d)
			return
		}
		c.reapBatchTime = d
	}
}

// DefaultOutboxRetention is how long [Reap] keeps an outbox message after it was published when
// no [OutboxRetention] option is given.
const DefaultOutboxRetention = 24 * time.Hour

// OutboxRetention sets how long [Reap] keeps a message of package outbox after it was published
// (or after it was written, for one an operator skipped), for operators to look at; then Reap
// deletes it. Messages not yet published are never reaped, whatever their age. The default is
// [DefaultOutboxRetention].
//
//	n, err := idem.Reap(ctx, pool, idem.OutboxRetention(7*24*time.Hour))
func OutboxRetention(d time.Duration) Option {
	return func(c *config) {
		if d < time.Second {
			c.setErr("OutboxRetention cannot be less than one second (got %s)", d)
			return
		}
		c.outboxRetention = d
	}
}

// Backoff sets how long [Run] waits before running the transaction again, as tx.Backoff does for
// tx.Run (Run is tx.Run with Do inside): a random wait up to min·2^(n-1), capped at max. The
// default is tx.Run's, 5ms to 500ms.
//
//	receipt, err := idem.Run(ctx, pool, key, transfer, idem.Backoff(10*time.Millisecond, 2*time.Second))
func Backoff(min, max time.Duration) Option {
	return func(c *config) {
		if min < 0 || max < min {
			c.setErr("Backoff needs 0 <= min <= max (got %s, %s)", min, max)
			return
		}
		c.backoff = &backoff.Jitter{Min: min, Max: max}
	}
}

// TracerProvider sets where [Do], [Run] and [Reap] send their spans; nil, or no option, means the
// global provider (otel.GetTracerProvider), which discards them until the application installs
// an SDK. Do's span is "idem.Do", with the attributes idem.scope, idem.key.hash (see
// [RecordKeys]) and idem.outcome (run, replay, in_flight, mismatch, race, invalid, error); key
// IDs are never recorded, in attributes or in error texts, since a client may reuse a secret as
// one.
//
//	idem.Do(ctx, tx, key, fn, idem.TracerProvider(tp))
func TracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// MeterProvider sets where [Do], [Run] and [Reap] send their metrics; nil, or no option, means
// the global provider (otel.GetMeterProvider). Metrics: idem.do.outcomes (a counter by
// idem.outcome), idem.do.duration (a histogram, seconds, by idem.outcome), idem.reaped (a
// counter by idem.what: do or run).
//
//	idem.Do(ctx, tx, key, fn, idem.MeterProvider(mp))
func MeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// Logger sets where [Reap] logs each batch it deletes (at debug level: what, how many, how
// long); nil, or no option, means slog.Default(). Do and Run log nothing: they return what
// happened to their caller.
//
//	n, err := idem.Reap(ctx, pool, idem.Logger(logger))
func Logger(l *slog.Logger) Option {
	return func(c *config) { c.log = l }
}

// RecordKeys makes [Do] and [Run] record key IDs as they are in their spans (idem.key.id, and in
// the error texts they record), instead of the short hash that stands for a key by default
// (idem.key.hash: 16 hex digits of a SHA-256 of the scope and ID, which idem keys get prints).
// For deployments whose keys are not secrets, where reading them in traces is worth more.
// Metrics never carry keys, hashed or not.
//
//	out, err := idem.Run(ctx, pool, key, fn, idem.RecordKeys())
func RecordKeys() Option {
	return func(c *config) { c.keys.Full = true }
}

func (c *config) logger() *slog.Logger {
	if c.log != nil {
		return c.log
	}
	return slog.Default()
}
