package idem

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/telemetry"
	"github.com/idemkit/idem/tx"
)

// Run is [Do] in a transaction that idem begins and commits itself: the shortest way to make a
// unit of work idempotent when it needs no other transaction around it. It is exactly
//
//	tx.Run(ctx, db, func(ctx context.Context, t pgx.Tx) error {
//		out, err = idem.Do(ctx, t, key, fn, opts...)
//		return err
//	}, tx.Isolation(...), tx.MaxAttempts(...))
//
// and so adds no round trip over the bare transaction: the key lookup travels in one pipelined
// batch with BEGIN, and the key write in one with COMMIT. A replay costs two round trips (BEGIN
// with the lookup, then COMMIT).
//
// Like tx.Run, it runs the whole transaction again, with jittered backoff, when Postgres reports
// a serialization failure or deadlock, when a racing duplicate wins, and when the COMMIT's
// acknowledgement is lost (the retry replays if the first COMMIT landed). [Isolation],
// [MaxAttempts] and [Backoff] configure that.
//
// db is a *pgxpool.Pool, or a *pgx.Conn (which cannot be used again once it died, so a lost
// COMMIT is then reported as tx.ErrCommitUnknown). Any other [Beginner] works too, at the cost of
// Do's two round trips.
//
// fn's transaction is Run's: fn must not commit or roll it back (those calls return an error),
// and it must not be used after fn returns. Savepoints (Begin) work as with any pgx.Tx.
//
//	receipt, err := idem.Run(ctx, pool, idem.Key{Scope: "customer:42", ID: key},
//		func(ctx context.Context, t pgx.Tx) (Receipt, error) {
//			return transfer(ctx, t, req)
//		})
func Run[T any](ctx context.Context, db Beginner, key Key, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...Option) (T, error) {
	var zero T
	if err := key.Validate(); err != nil {
		return zero, err
	}
	if fn == nil {
		return zero, errors.New("idem: Run needs a function to run; fn is nil")
	}
	if db == nil {
		return zero, errors.New("idem: Run needs a database; db is nil")
	}
	cfg := newConfig(opts)
	if cfg.err != nil {
		return zero, cfg.err
	}
	txOpts := []tx.Option{tx.MaxAttempts(cfg.maxTries)}
	if cfg.isoLevel != "" {
		txOpts = append(txOpts, tx.Isolation(cfg.isoLevel))
	}
	if cfg.backoff != nil {
		txOpts = append(txOpts, tx.Backoff(cfg.backoff.Min, cfg.backoff.Max))
	}
	ctx, span := telemetry.For(cfg.tracerProvider, cfg.meterProvider).Tracer.Start(ctx, "idem.Run", trace.WithSpanKind(trace.SpanKindInternal))
	defer span.End()
	var (
		out      T
		attempts int
	)
	err := tx.Run(ctx, db, func(ctx context.Context, t pgx.Tx) error {
		attempts++
		var err error
		out, err = Do(ctx, t, key, fn, opts...)
		return err
	}, txOpts...)
	if span.IsRecording() {
		rk := redact.Key{Scope: key.Scope, ID: key.ID}
		span.SetAttributes(telemetry.Scope.String(key.Scope), cfg.keys.Attr(rk), telemetry.Attempts.Int(attempts), telemetry.Outcome.String(outcomeOf(err)))
		if outcomeOf(err) == outcomeError {
			cfg.keys.RecordError(span, err, rk)
		}
	}
	if err != nil {
		return zero, err
	}
	return out, nil
}
