package tx

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/backoff"
)

// Defaults used when Run is called without the corresponding option.
const (
	defaultMaxAttempts = 10
	defaultBackoffMin  = 5 * time.Millisecond
	defaultBackoffMax  = 500 * time.Millisecond
)

// Option configures [Run]. Options are applied in order, so a later option
// overrides an earlier one of the same kind.
//
//	err := tx.Run(ctx, pool, fn,
//		tx.Isolation(pgx.Serializable),
//		tx.MaxAttempts(5),
//		tx.Backoff(10*time.Millisecond, time.Second),
//	)
type Option func(*config)

type config struct {
	isoLevel    pgx.TxIsoLevel
	readOnly    bool
	maxAttempts int
	backoffMin  time.Duration
	backoffMax  time.Duration

	// err holds the first invalid option. Options cannot return errors
	// themselves, so Run reports it before beginning anything.
	err error
}

func newConfig(opts []Option) *config {
	cfg := &config{
		maxAttempts: defaultMaxAttempts,
		backoffMin:  defaultBackoffMin,
		backoffMax:  defaultBackoffMax,
	}
	for _, opt := range opts {
		opt(cfg)
	}
	return cfg
}

func (c *config) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// hasTxOptions reports whether BEGIN needs more than the server's defaults.
func (c *config) hasTxOptions() bool { return c.isoLevel != "" || c.readOnly }

func (c *config) txOptions() pgx.TxOptions {
	opts := pgx.TxOptions{IsoLevel: c.isoLevel}
	if c.readOnly {
		opts.AccessMode = pgx.ReadOnly
	}
	return opts
}

// Isolation sets the isolation level of the transaction. Retrying is what
// makes the stricter levels practical: under pgx.Serializable, Postgres
// aborts one of two conflicting transactions with SQLSTATE 40001 and Run
// runs it again.
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
//		// Reads and writes here behave as if no other transaction ran
//		// at the same time.
//		return nil
//	}, tx.Isolation(pgx.Serializable))
//
// It cannot be used when Run is given a pgx.Tx (a nested transaction is a
// savepoint, which has no isolation level of its own).
func Isolation(level pgx.TxIsoLevel) Option {
	return func(c *config) { c.isoLevel = level }
}

// ReadOnly begins the transaction READ ONLY: any write fails with SQLSTATE
// 25006. With pgx.Serializable it also lets Postgres take cheaper snapshots.
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
//		return dbtx.QueryRow(ctx, "SELECT count(*) FROM accounts").Scan(&n)
//	}, tx.ReadOnly())
//
// It cannot be used when Run is given a pgx.Tx.
func ReadOnly() Option {
	return func(c *config) { c.readOnly = true }
}

// MaxAttempts bounds how many times Run begins the transaction, the first
// attempt included. The default is 10. MaxAttempts(1) turns retrying off.
// n must be at least 1, or Run returns an error before beginning anything.
//
//	err := tx.Run(ctx, pool, fn, tx.MaxAttempts(3))
func MaxAttempts(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.fail(fmt.Errorf("tx: MaxAttempts must be at least 1 (got %d)", n))
			return
		}
		c.maxAttempts = n
	}
}

// Backoff sets how long Run waits before a retry: before the n-th retry it
// waits a random duration up to min·2^(n-1), capped at max
// ("full jitter", so that transactions that conflicted once do not collide
// again in lockstep). The default is 5ms to 500ms. Backoff(0, 0) retries at
// once. min cannot be negative and max cannot be less than min, or Run
// returns an error before beginning anything.
//
//	err := tx.Run(ctx, pool, fn, tx.Backoff(10*time.Millisecond, 2*time.Second))
//
// The wait ends early when ctx is done, and Run returns.
func Backoff(min, max time.Duration) Option {
	return func(c *config) {
		if min < 0 {
			c.fail(fmt.Errorf("tx: Backoff min cannot be negative (got %s)", min))
			return
		}
		if max < min {
			c.fail(fmt.Errorf("tx: Backoff max cannot be less than min (got %s and %s)", max, min))
			return
		}
		c.backoffMin, c.backoffMax = min, max
	}
}

// backoff returns the wait before the given retry (1 for the first).
func (c *config) backoff(retry int) time.Duration {
	return backoff.Jitter{Min: c.backoffMin, Max: c.backoffMax}.Wait(retry)
}
