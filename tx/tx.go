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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/txctl"
	"github.com/idemkit/idem/internal/txown"
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
	conns := connSource(db)

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
			if err := backoff.Sleep(ctx, cfg.backoff(attempt-1)); err != nil {
				return fail(stopped(err, attempt-1, lastErr))
			}
		}
		if err := ctx.Err(); err != nil {
			if lastErr == nil {
				return err
			}
			return fail(stopped(err, attempt-1, lastErr))
		}

		a := &txctl.Attempt{Rerun: unknownErr != nil, Prev: lastErr}
		var retry bool
		var err error
		if conns != nil {
			retry, err = runOwned(ctx, conns, cfg, a, fn)
		} else {
			retry, err = runOnce(ctx, db, cfg, a, fn)
		}
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
			return fail(fmt.Errorf("tx: giving up after %s: %w", attempts(attempt), err))
		}
		lastErr = err
	}
}

func stopped(ctxErr error, n int, lastErr error) error {
	return fmt.Errorf("tx: stopped retrying after %s because the context is done: %w; last error: %w", attempts(n), ctxErr, lastErr)
}

func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// conns hands out the connection of one attempt, for a db whose connections Run can hold itself.
type conns struct {
	acquire func(ctx context.Context) (*pgx.Conn, func(), error)
	single  bool // one connection for all attempts: once it is dead, no retry can succeed
}

func connSource(db Beginner) *conns {
	switch d := db.(type) {
	case *pgxpool.Pool:
		return &conns{acquire: func(ctx context.Context) (*pgx.Conn, func(), error) {
			c, err := d.Acquire(ctx)
			if err != nil {
				return nil, nil, fmt.Errorf("tx: error acquiring a connection: %w", err)
			}
			return c.Conn(), c.Release, nil
		}}
	case *pgxpool.Conn:
		return &conns{single: true, acquire: func(context.Context) (*pgx.Conn, func(), error) { return d.Conn(), func() {}, nil }}
	case *pgx.Conn:
		return &conns{single: true, acquire: func(context.Context) (*pgx.Conn, func(), error) { return d, func() {}, nil }}
	}
	return nil
}

// runOwned runs one attempt on a connection Run holds, through an ownedTx, and gives the
// connection back clean whatever happens, a panic in fn included: no transaction left open.
func runOwned(ctx context.Context, src *conns, cfg *config, a *txctl.Attempt, fn func(context.Context, pgx.Tx) error) (retry bool, err error) {
	conn, release, err := src.acquire(ctx)
	if err != nil {
		return IsRetryable(err) || IsConnectionLost(err), err
	}
	defer release()
	if conn.IsClosed() {
		return false, errors.New("tx: the connection given to Run is closed; pass a *pgxpool.Pool to have Run retry on a new one")
	}
	if status := conn.PgConn().TxStatus(); status != 'I' {
		return false, errors.New("tx: the connection given to Run is already in a transaction; pass that transaction (a pgx.Tx) instead, and Run uses a savepoint")
	}
	t := txown.New(conn, cfg.txOptions(), a)
	done := false
	defer func() {
		t.Close()
		if !done {
			// fn panicked or returned an error: nothing of this attempt may stay open.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			t.RollbackNow(rctx)
		}
	}()

	if err := fn(ctx, t); err != nil {
		return retryAfterFn(err, src.single), err
	}
	t.Close()
	// pgx would not send COMMIT with a done context, yet report it as a
	// failed COMMIT; rolling back here keeps the outcome known.
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("tx: context done before COMMIT, so the transaction was rolled back: %w", err)
	}
	if err := t.CommitNow(ctx); err != nil {
		if errors.Is(err, ErrCommitUnknown) {
			return a.Idempotent() && !(src.single && conn.IsClosed()), err
		}
		return IsRetryable(err) || lostBeforeCommit(err), err
	}
	done = true
	return false, nil
}

// retryAfterFn decides whether an attempt whose fn failed is worth another: a serialization
// failure or deadlock, or a connection lost before anything was committed (BEGIN travels with
// fn's first statement, so a connection that died while idle in the pool fails there), when
// another connection can be had.
func retryAfterFn(err error, single bool) bool {
	return IsRetryable(err) || (!single && lostBeforeCommit(err))
}

// lostBeforeCommit is a connection that failed before COMMIT was sent: nothing landed.
func lostBeforeCommit(err error) bool { return beginFailed(err) && IsConnectionLost(err) }

// beginFailed reports whether err says that nothing of the attempt was sent for COMMIT.
func beginFailed(err error) bool {
	var u *txown.Unsent
	return errors.As(err, &u)
}

// runOnce runs one attempt on a transaction that db begins.
func runOnce(ctx context.Context, db Beginner, cfg *config, a *txctl.Attempt, fn func(context.Context, pgx.Tx) error) (retry bool, err error) {
	real, err := begin(ctx, db, cfg)
	if err != nil {
		// A failed BEGIN leaves nothing behind, so any lost connection
		// (a pooled connection that died while idle, a terminated
		// backend) is worth another attempt on a new one.
		return IsRetryable(err) || IsConnectionLost(err), fmt.Errorf("tx: error beginning transaction: %w", err)
	}
	// Rolls back when fn panics; after Commit or Rollback it is a no-op.
	defer func() { _ = real.Rollback(ctx) }()

	guarded := txown.NewGuard(real, a)
	if err := fn(ctx, guarded); err != nil {
		_ = real.Rollback(ctx) // fn's error says more than a failed rollback
		return IsRetryable(err), err
	}
	if err := guarded.TxEnded(); err != nil {
		// fn tried to end the transaction (refused), or did through the raw connection.
		_ = real.Rollback(ctx)
		return false, err
	}

	// pgx would not send COMMIT with a done context, yet report it as a
	// failed COMMIT; rolling back here keeps the outcome known.
	if err := ctx.Err(); err != nil {
		_ = real.Rollback(ctx)
		return false, fmt.Errorf("tx: context done before COMMIT, so the transaction was rolled back: %w", err)
	}

	if err := real.Commit(ctx); err != nil {
		wrapped, unknown := commitError(err)
		if unknown {
			return a.Idempotent(), wrapped
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
		return nil, fmt.Errorf("tx: %T has no BeginTx method, so Isolation and ReadOnly cannot be used with it", db)
	}
	return b.BeginTx(ctx, cfg.txOptions())
}

// runNested runs fn in a savepoint of parent. It does not retry: see Run.
func runNested(ctx context.Context, parent pgx.Tx, cfg *config, fn func(context.Context, pgx.Tx) error) error {
	if cfg.isoLevel != "" {
		return errors.New("tx: isolation cannot be set on a nested transaction")
	}
	if cfg.readOnly {
		return errors.New("tx: read-only cannot be set on a nested transaction")
	}

	sp, err := parent.Begin(ctx)
	if err != nil {
		return fmt.Errorf("tx: error beginning nested transaction: %w", err)
	}
	defer func() { _ = sp.Rollback(ctx) }()

	// A savepoint of a transaction of Run's is already a txown.Savepoint, whose
	// release passes its mark on; one of some other transaction gets an
	// attempt of its own, which nothing reads.
	var child pgx.Tx = sp
	if _, ok := sp.(txctl.Carrier); !ok {
		child = txown.NewSavepoint(sp, &txctl.Attempt{})
	}
	if err := fn(ctx, child); err != nil {
		_ = child.Rollback(ctx)
		return err
	}
	if err := child.Commit(ctx); err != nil {
		return fmt.Errorf("tx: error releasing nested transaction: %w", err)
	}
	return nil
}
