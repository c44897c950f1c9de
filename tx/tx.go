// Package tx runs a function in a Postgres transaction: it begins, commits,
// retries the whole transaction when Postgres aborts it to break a conflict
// (SQLSTATE 40001 or 40P01), and never guesses at the outcome of a COMMIT
// whose answer was lost.
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
//		_, err := dbtx.Exec(ctx, "UPDATE accounts SET balance = balance - 10 WHERE id = $1", from)
//		if err != nil {
//			return err
//		}
//		_, err = dbtx.Exec(ctx, "UPDATE accounts SET balance = balance + 10 WHERE id = $1", to)
//		return err
//	}, tx.Isolation(pgx.Serializable))
//
// fn may run more than once, so it must not have effects outside the
// transaction that cannot be repeated, and should not hold on to values from
// a failed attempt.
//
// When the connection dies after COMMIT was sent, Run cannot know whether the
// transaction committed. It reports that as [ErrCommitUnknown] rather than as
// success or failure, unless fn called [MarkIdempotent] to declare that a
// rerun is safe, in which case Run runs the transaction again.
package tx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Beginner begins a transaction. It is satisfied by *pgxpool.Pool,
// *pgxpool.Conn, *pgx.Conn and pgx.Tx (where Begin starts a savepoint).
//
//	var db tx.Beginner = pool // or conn, or an open pgx.Tx
//
// [Isolation] and [ReadOnly] need BeginTx as well, which all of them but
// pgx.Tx have.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// txBeginner is the part of *pgxpool.Pool and *pgx.Conn that takes
// transaction options. pgx.Tx lacks it, which is why Beginner asks only for
// Begin.
type txBeginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// Run begins a transaction on db, calls fn with it and commits. If fn returns
// an error, the transaction is rolled back and the error is returned as is
// (errors.Is and errors.As see what fn returned); if fn panics, the
// transaction is rolled back and the panic continues.
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
//		_, err := dbtx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", id, total)
//		return err
//	})
//
// The parameter is named dbtx here because tx would hide this package.
//
// Run retries, in a new transaction and after a randomized [Backoff], when
// the transaction fails in a way that another try may fix: fn or COMMIT
// fails with an error for which [IsRetryable] is true (serialization
// failure, deadlock), or BEGIN fails in a way that pgx reports as safe to
// retry (as on a pooled connection that died while idle). It gives up
// after [MaxAttempts] (10 by default), returning the last error wrapped as
// "giving up after N attempts: ...". When ctx is done it stops, returning
// ctx's error together with the last error.
//
// A COMMIT that was sent but not answered (the connection died, ctx was
// cancelled while waiting, the server ended the session) leaves the outcome
// unknown: Run returns an error that wraps [ErrCommitUnknown] and the cause,
// and does not retry, because the transaction may have landed. If fn called
// [MarkIdempotent] during that attempt, Run runs the transaction again
// instead. An ERROR from the server in reply to COMMIT is a known rollback,
// and is retried or returned like an error from fn.
//
// The ctx that fn receives is derived from ctx; pass it on to functions that
// call [MarkIdempotent], such as idem.Do.
//
// When db is a pgx.Tx, Run works inside it as a nested transaction: it
// begins a savepoint, calls fn, and releases the savepoint, or rolls back to
// it if fn fails. It does not retry then, because a serialization failure or
// deadlock aborts the enclosing transaction as a whole: the error is
// returned for the enclosing Run to retry. [Isolation] and [ReadOnly] are
// errors in that case ("isolation cannot be set on a nested transaction").
func Run(ctx context.Context, db Beginner, fn func(ctx context.Context, tx pgx.Tx) error, opts ...Option) error {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return cfg.err
	}
	if db == nil {
		return errors.New("tx: db cannot be nil: pass a *pgxpool.Pool, *pgx.Conn or pgx.Tx")
	}
	if fn == nil {
		return errors.New("tx: fn cannot be nil: pass the function to run in the transaction")
	}
	if parent, ok := db.(pgx.Tx); ok {
		return runNested(ctx, parent, cfg, fn)
	}

	var (
		lastErr    error
		unknownErr error // from the last attempt whose COMMIT went unanswered
	)
	// fail adds an earlier unanswered COMMIT to a final error: when a rerun
	// fails too, the first attempt may still have landed.
	fail := func(err error) error {
		if unknownErr != nil && !errors.Is(err, ErrCommitUnknown) {
			return fmt.Errorf("%w; an earlier attempt: %w", err, unknownErr)
		}
		return err
	}

	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			if err := sleep(ctx, cfg.backoff(attempt-1)); err != nil {
				return fail(stopped(err, attempt-1, lastErr))
			}
		}
		if err := ctx.Err(); err != nil {
			if lastErr == nil {
				return err
			}
			return fail(stopped(err, attempt-1, lastErr))
		}

		actx := ctx
		if unknownErr != nil {
			actx = context.WithValue(ctx, lostCommitKey{}, true)
		}
		retry, err := runOnce(actx, db, cfg, fn)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrCommitUnknown) {
			unknownErr = err
		}
		if !retry {
			return fail(err)
		}
		if attempt >= cfg.maxAttempts {
			return fail(fmt.Errorf("giving up after %s: %w", attempts(attempt), err))
		}
		lastErr = err
	}
}

func stopped(ctxErr error, n int, lastErr error) error {
	return fmt.Errorf("stopped retrying after %s because the context is done: %w; last error: %w", attempts(n), ctxErr, lastErr)
}

func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// runOnce runs one attempt and reports its error and whether another
// attempt may succeed.
func runOnce(ctx context.Context, db Beginner, cfg *config, fn func(context.Context, pgx.Tx) error) (retry bool, err error) {
	dbtx, err := begin(ctx, db, cfg)
	if err != nil {
		// A failed BEGIN leaves nothing behind, so any lost connection
		// (a pooled connection that died while idle, a terminated
		// backend) is worth another attempt on a new one.
		return IsRetryable(err) || IsConnectionLost(err), fmt.Errorf("error beginning transaction: %w", err)
	}
	// Rolls back when fn panics; after Commit or Rollback it is a no-op.
	defer func() { _ = dbtx.Rollback(ctx) }()

	a := &attempt{}
	if err := fn(withAttempt(ctx, a), dbtx); err != nil {
		_ = dbtx.Rollback(ctx) // fn's error says more than a failed rollback
		return IsRetryable(err), err
	}

	// pgx would not send COMMIT with a done context, yet report it as a
	// failed COMMIT; rolling back here keeps the outcome known.
	if err := ctx.Err(); err != nil {
		_ = dbtx.Rollback(ctx)
		return false, fmt.Errorf("context done before COMMIT, so the transaction was rolled back: %w", err)
	}

	if err := dbtx.Commit(ctx); err != nil {
		wrapped, unknown := commitError(err)
		if unknown {
			return a.idempotent.Load(), wrapped
		}
		return IsRetryable(err), wrapped
	}
	return false, nil
}

func begin(ctx context.Context, db Beginner, cfg *config) (pgx.Tx, error) {
	if !cfg.hasTxOptions() {
		return db.Begin(ctx)
	}
	b, ok := db.(txBeginner)
	if !ok {
		return nil, fmt.Errorf("%T has no BeginTx method, so Isolation and ReadOnly cannot be used with it", db)
	}
	return b.BeginTx(ctx, cfg.txOptions())
}

// runNested runs fn in a savepoint of parent. It does not retry: see Run.
func runNested(ctx context.Context, parent pgx.Tx, cfg *config, fn func(context.Context, pgx.Tx) error) error {
	if cfg.isoLevel != "" {
		return errors.New("isolation cannot be set on a nested transaction")
	}
	if cfg.readOnly {
		return errors.New("read-only cannot be set on a nested transaction")
	}

	sp, err := parent.Begin(ctx)
	if err != nil {
		return fmt.Errorf("error beginning nested transaction: %w", err)
	}
	defer func() { _ = sp.Rollback(ctx) }()

	a := &attempt{}
	if err := fn(withAttempt(ctx, a), sp); err != nil {
		_ = sp.Rollback(ctx)
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("error releasing nested transaction: %w", err)
	}
	// The savepoint's writes are now part of the enclosing transaction,
	// and so is the promise that rerunning them is safe.
	if a.idempotent.Load() {
		MarkIdempotent(ctx)
	}
	return nil
}

// sleep waits for d or until ctx is done, whichever comes first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
