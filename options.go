package idem

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
	err        error
}

func newConfig(opts []Option) *config {
	c := &config{ttl: DefaultTTL, retryAfter: time.Second, maxTries: 10}
	for _, o := range opts {
		o(c)
	}
	return c
}

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
// option to [Migrate] and to every call.
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
