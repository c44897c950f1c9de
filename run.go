package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/tx"
)

// Run is [Do] in a transaction that idem begins and commits itself: the shortest way to make a
// unit of work idempotent when it needs no other transaction around it.
//
// Owning the transaction lets Run hide idem's statements in round trips the transaction makes
// anyway: the key lookup travels in one pipelined batch with BEGIN, and the key write in one
// with COMMIT. Run adds no round trip over the bare transaction. A replay costs two round trips
// (BEGIN with the lookup, then COMMIT).
//
// Like [tx.Run], it runs the whole transaction again, with jittered backoff, when Postgres reports
// a serialization failure or deadlock, when a racing duplicate wins, and when the COMMIT's
// acknowledgement is lost (the retry replays if the first COMMIT landed). [Isolation] and
// [MaxAttempts] configure that.
//
// db is a *pgxpool.Pool or a *pgx.Conn for the fast path. Any other [Beginner] (a pgx.Tx, say)
// works too, through tx.Run and Do, at the ordinary cost.
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
	cfg := newConfig(opts)
	if cfg.err != nil {
		return zero, cfg.err
	}

	var acquire func(ctx context.Context) (*pgx.Conn, func(), error)
	reusable := true // false for a *pgx.Conn: once dead, it stays dead
	switch d := db.(type) {
	case nil:
		return zero, errors.New("idem: Run needs a database; db is nil")
	case *pgxpool.Pool:
		acquire = func(ctx context.Context) (*pgx.Conn, func(), error) {
			c, err := d.Acquire(ctx)
			if err != nil {
				return nil, nil, fmt.Errorf("idem: error acquiring a connection: %w", err)
			}
			return c.Conn(), c.Release, nil
		}
	case *pgx.Conn:
		reusable = false
		acquire = func(context.Context) (*pgx.Conn, func(), error) {
			if d.IsClosed() {
				return nil, nil, errors.New("idem: the connection given to Run is closed; pass a *pgxpool.Pool to have Run retry on a new one")
			}
			return d, func() {}, nil
		}
	default:
		var out T
		err := tx.Run(ctx, db, func(ctx context.Context, t pgx.Tx) error {
			var err error
			out, err = Do(ctx, t, key, fn, opts...)
			return err
		}, tx.Isolation(cfg.isoLevel), tx.MaxAttempts(cfg.maxTries))
		return out, err
	}

	var lastErr, unknown error
	// fail keeps an earlier unanswered COMMIT in the final error: when a rerun fails too, the
	// first attempt may still have landed, and the caller must not be told otherwise.
	fail := func(err error) error {
		if unknown != nil && !errors.Is(err, tx.ErrCommitUnknown) {
			return fmt.Errorf("%w; an earlier attempt: %w", err, unknown)
		}
		return err
	}
	for attempt := 1; attempt <= cfg.maxTries; attempt++ {
		if attempt > 1 {
			if err := sleepBackoff(ctx, attempt); err != nil {
				return zero, fail(fmt.Errorf("idem: stopped retrying: %w (last error: %w)", err, lastErr))
			}
		}
		out, err := runAttempt(ctx, acquire, cfg, key, fn)
		if err == nil {
			return out, nil
		}
		switch {
		case errors.Is(err, tx.ErrCommitUnknown):
			// A transaction that ran Do may run again: if the first COMMIT landed, this replays.
			unknown = err
			if !reusable {
				return zero, err
			}
		case unknown != nil && errors.Is(err, ErrInFlight):
			// The backend of the attempt whose COMMIT went unanswered may still hold the key
			// until it notices its client is gone.
		case !tx.IsRetryable(err):
			return zero, fail(err)
		}
		lastErr = err
	}
	return zero, fail(fmt.Errorf("idem: giving up after %d attempts: %w", cfg.maxTries, lastErr))
}

// runAttempt runs one attempt on a connection of its own, and gives the connection back clean
// whatever happens, a panic in fn included: no transaction left open, no key left held.
func runAttempt[T any](ctx context.Context, acquire func(context.Context) (*pgx.Conn, func(), error), cfg *config, key Key, fn func(context.Context, pgx.Tx) (T, error)) (out T, err error) {
	conn, release, err := acquire(ctx)
	if err != nil {
		return out, err
	}
	defer release()
	if status := conn.PgConn().TxStatus(); status != 'I' {
		return out, errors.New("idem: the connection given to Run is already in a transaction; use idem.Do with that transaction instead")
	}
	st := statementsFor(cfg.schema)
	lock := lockID(cfg.schema, key)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: cfg.isoLevel})
	b.Queue(st.lookup, key.Scope, key.ID, lock)
	br := conn.SendBatch(ctx, b)
	t := &ownedTx{Tx: br.Tx()}
	open := true
	defer func() {
		t.closed.Store(true) // a t kept past fn's return must not reach a connection now pooled
		if open && !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			// Runs on errors and on panics alike; a connection that cannot roll back is closed,
			// which ends the transaction on the server and makes the pool drop it.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
				_ = conn.Close(rctx)
			}
		}
	}()
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return out, fmt.Errorf("idem: error beginning transaction: %w", err)
	}
	row, err := scanKeyRow(br.QueryRow())
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return out, err
	}

	v, err := decide(key, cfg, row)
	if errors.Is(err, ErrInFlight) && cfg.wait > 0 {
		err = waitFor(ctx, cfg, func() error {
			var err error
			if row, err = lookupRow(ctx, conn, st, key, lock); err != nil {
				return err
			}
			v, err = decide(key, cfg, row)
			return err
		})
	}
	if err != nil {
		return out, err
	}
	if v == verdictReplay {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return out, fmt.Errorf("idem: error ending read-only transaction: %w", err)
		}
		open = false
		return decodeResult[T](key, row.result)
	}

	res, err := fn(ctx, t)
	if err != nil {
		return out, err
	}
	data, err := marshalResult(res)
	if err != nil {
		return out, err
	}
	// pgx sends nothing with a done context, yet would report a failed COMMIT; rolling back here
	// keeps the outcome known.
	if err := ctx.Err(); err != nil {
		return out, fmt.Errorf("idem: context done before COMMIT, so the transaction was rolled back: %w", err)
	}
	sql := st.insert
	if v == verdictRunExpired {
		sql = st.replace
	}
	b = &pgx.Batch{}
	b.Queue(sql, key.Scope, key.ID, key.Fingerprint, data, cfg.ttl.Microseconds())
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	_, werr := br.Exec()
	tag, cerr := br.Exec()
	closeErr := br.Close()
	switch {
	case werr != nil:
		if isKnownFailure(werr) {
			return out, storeError(key, werr)
		}
		return out, fmt.Errorf("idem: %w: %w", tx.ErrCommitUnknown, werr)
	case cerr != nil || closeErr != nil:
		if isKnownFailure(cerr) {
			return out, fmt.Errorf("idem: error committing: %w", cerr)
		}
		return out, fmt.Errorf("idem: %w: %w", tx.ErrCommitUnknown, errors.Join(cerr, closeErr))
	case tag.String() != "COMMIT":
		return out, fmt.Errorf("idem: transaction was rolled back at COMMIT (%s)", tag)
	}
	open = false
	return decodeResult[T](key, data)
}

// isKnownFailure reports whether Postgres answered with an ERROR, so the outcome of what was sent
// is known: the statement failed and the transaction did not commit. FATAL and PANIC do not
// count: a backend terminated while waiting for a synchronous standby reports FATAL after its
// commit is already durable.
func isKnownFailure(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	severity := pgErr.SeverityUnlocalized
	if severity == "" {
		severity = pgErr.Severity
	}
	return severity == "ERROR"
}

func sleepBackoff(ctx context.Context, attempt int) error {
	ceiling := min(5*time.Millisecond<<min(attempt-2, 10), 500*time.Millisecond)
	t := time.NewTimer(rand.N(ceiling) + time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
