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
// and its LargeObjects are not available.
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
	switch d := db.(type) {
	case nil:
		return zero, errors.New("idem: Run needs a database; db is nil")
	case *pgxpool.Pool:
		acquire = func(ctx context.Context) (*pgx.Conn, func(), error) {
			c, err := d.Acquire(ctx)
			if err != nil {
				return nil, nil, err
			}
			return c.Conn(), c.Release, nil
		}
	case *pgx.Conn:
		acquire = func(context.Context) (*pgx.Conn, func(), error) { return d, func() {}, nil }
	default:
		var out T
		err := tx.Run(ctx, db, func(ctx context.Context, t pgx.Tx) error {
			var err error
			out, err = Do(ctx, t, key, fn, opts...)
			return err
		}, tx.Isolation(cfg.isoLevel), tx.MaxAttempts(cfg.maxTries))
		return out, err
	}

	var lastErr error
	for attempt := 1; attempt <= cfg.maxTries; attempt++ {
		if attempt > 1 {
			if err := sleepBackoff(ctx, attempt); err != nil {
				return zero, fmt.Errorf("idem: %w (last error: %w)", err, lastErr)
			}
		}
		conn, release, err := acquire(ctx)
		if err != nil {
			return zero, fmt.Errorf("idem: error acquiring a connection: %w", err)
		}
		out, err := runOnce(ctx, conn, cfg, key, fn)
		release()
		if err == nil {
			return out, nil
		}
		if !tx.IsRetryable(err) && !errors.Is(err, errCommitLost) {
			return zero, err
		}
		lastErr = err
	}
	return zero, fmt.Errorf("idem: giving up after %d attempts: %w", cfg.maxTries, lastErr)
}

// errCommitLost marks a COMMIT whose acknowledgement never came. For a transaction that ran Do
// that is safe to retry, which Run does.
var errCommitLost = errors.New("idem: the connection failed while committing; the outcome is unknown")

func runOnce[T any](ctx context.Context, conn *pgx.Conn, cfg *config, key Key, fn func(context.Context, pgx.Tx) (T, error)) (out T, err error) {
	st := statementsFor(cfg.schema)
	lock := lockID(cfg.schema, key)
	begun := false
	defer func() {
		// A failed attempt leaves the transaction open (or aborted) on a connection that goes
		// back to the pool: end it. On a dead connection this fails, and the pool drops it.
		if err != nil && begun && !conn.IsClosed() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
				_ = conn.Close(rctx)
			}
		}
	}()

	b := &pgx.Batch{}
	b.Queue(beginSQL(cfg.isoLevel))
	b.Queue(st.lookup, key.Scope, key.ID, lock)
	br := conn.SendBatch(ctx, b)
	begun = true
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
		return decodeResult[T](key, row.result)
	}

	t := &connTx{conn: conn}
	res, err := fn(ctx, t)
	if err != nil {
		return out, err
	}
	data, err := marshalResult(res)
	if err != nil {
		return out, err
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
		if isServerError(werr) {
			return out, storeError(key, werr)
		}
		return out, fmt.Errorf("%w: %w", errCommitLost, werr)
	case cerr != nil || closeErr != nil:
		if isServerError(cerr) {
			return out, fmt.Errorf("idem: error committing: %w", cerr)
		}
		return out, fmt.Errorf("%w: %w", errCommitLost, errors.Join(cerr, closeErr))
	case tag.String() != "COMMIT":
		return out, fmt.Errorf("idem: transaction was rolled back at COMMIT (%s)", tag)
	}
	begun = false
	return decodeResult[T](key, data)
}

func beginSQL(level pgx.TxIsoLevel) string {
	if level == "" {
		return "BEGIN"
	}
	return "BEGIN ISOLATION LEVEL " + string(level)
}

// isServerError reports whether Postgres itself answered with an error, so the outcome of what
// was sent is known: the statement failed and the transaction did not commit.
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
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
