package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/tx"
)

// Do runs fn at most once per key, inside t, and returns its result; a later call with the same
// key returns the stored result without running fn.
//
// fn receives t, which by then holds the key: everything fn writes through it, River jobs it
// inserts with InsertTx included, commits together with the stored result, or not at all. The
// caller owns t and commits it (or let [tx.Run] do so: it also retries the races below).
//
// Outcomes:
//   - First time: fn runs; its result (any T that round-trips through encoding/json) is stored
//     in t. Do returns the result as decoded from what was stored, so the first answer and every
//     replay are the same value.
//   - Completed before (and not expired): fn does not run; the stored result is returned.
//   - Running right now in another transaction: [ErrInFlight] at once, as an *InFlightError with
//     a retry-after hint. With the [Wait] option Do waits up to a bound and then replays (or
//     runs fn, if the other transaction rolled back).
//   - Used before with a different Fingerprint: [ErrMismatch]; fn does not run.
//   - Malformed key: [ErrInvalidKey], before any SQL.
//   - Expired ([TTL], default 24h): treated as new.
//   - fn returns an error: Do returns it and stores nothing. Roll back, and the key is free again.
//     A failure that must be final (a declined card) belongs in T, so that it is stored and
//     replayed like any result.
//
// A duplicate that committed the same key after t's snapshot was taken cannot be seen by t; Do
// then runs fn, but its write is rejected by the primary key, Postgres aborts t, and Do returns
// an *InFlightError with Race set (or Postgres's 40001, under REPEATABLE READ and SERIALIZABLE).
// Both are retryable: roll back, retry, and the retry replays. Two effects for one key cannot
// commit.
//
// The SQL: one statement before fn, a SELECT that reads the key's row and, unless the key is
// done, takes a transaction-scoped advisory lock with pg_try_advisory_xact_lock (it never
// waits). After fn, one INSERT of the result (an UPDATE-or-INSERT when the key had expired). A
// replay is the SELECT alone. No row is written for work that does not commit, and nothing is
// ever updated on the fresh path, so a call leaves no dead tuple behind.
//
// Inside [tx.Run], Do marks the transaction idempotent: if the COMMIT's acknowledgement is lost,
// tx.Run runs it again and the second run replays. Everything with an effect must then happen
// inside fn.
//
//	type Receipt struct{ TransferID int64 }
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
//		receipt, err := idem.Do(ctx, t, idem.Key{Scope: "customer:42", ID: key},
//			func(ctx context.Context, t pgx.Tx) (Receipt, error) {
//				var r Receipt
//				err := t.QueryRow(ctx, `INSERT INTO transfers (amount) VALUES ($1) RETURNING id`,
//					100).Scan(&r.TransferID)
//				return r, err
//			})
//		fmt.Println(receipt.TransferID, err)
//		return err
//	})
func Do[T any](ctx context.Context, t pgx.Tx, key Key, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...Option) (T, error) {
	var zero T
	if err := key.Validate(); err != nil {
		return zero, err
	}
	if t == nil {
		return zero, errors.New("idem: Do needs a transaction; t is nil")
	}
	if fn == nil {
		return zero, errors.New("idem: Do needs a function to run; fn is nil")
	}
	cfg := newConfig(opts)
	if cfg.err != nil {
		return zero, cfg.err
	}
	tx.MarkIdempotent(ctx)
	if tx.AfterLostCommit(ctx) && cfg.wait < lostCommitWait {
		// The lost attempt's backend may still hold this key's lock for a moment: that is not a
		// concurrent duplicate, and the rerun should get its own answer, not ErrInFlight.
		cfg.wait = lostCommitWait
	}

	st := statementsFor(cfg.schema)
	lock := lockID(cfg.schema, key)
	var (
		v   verdict
		row keyRow
	)
	err := waitFor(ctx, cfg, func() error {
		var err error
		if row, err = lookupRow(ctx, t, st, key, lock); err != nil {
			return err
		}
		v, err = decide(key, cfg, row)
		return err
	})
	if err != nil {
		return zero, err
	}
	if v == verdictReplay {
		return decodeResult[T](key, row.result)
	}

	out, err := fn(ctx, t)
	if err != nil {
		return zero, err
	}
	data, err := marshalResult(out)
	if err != nil {
		return zero, err
	}
	sql := st.insert
	if v == verdictRunExpired {
		sql = st.replace
	}
	if _, err := t.Exec(ctx, sql, key.Scope, key.ID, key.Fingerprint, data, cfg.ttl.Microseconds()); err != nil {
		return zero, storeError(key, err)
	}
	return decodeResult[T](key, data)
}

// lostCommitWait bounds how long a rerun after a lost COMMIT waits for the lost attempt's
// backend to let go of the key. A backend whose client closed the connection ends in
// milliseconds; one cut off without a FIN lives until TCP keepalive notices, and then the
// rerun reports ErrInFlight, which is the truth.
const lostCommitWait = 5 * time.Second

// keyRow is what the lookup statement returns. found is false when the key has no row.
type keyRow struct {
	found       bool
	state       string
	workflow    *string
	fingerprint []byte
	result      []byte
	live        bool
	locked      bool
	leaseLeft   *int32
}

func lookupRow(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, st *statements, key Key, lock int64) (keyRow, error) {
	return scanKeyRow(q.QueryRow(ctx, st.lookup, key.Scope, key.ID, lock))
}

func scanKeyRow(r pgx.Row) (keyRow, error) {
	var (
		row   keyRow
		state *string
		live  *bool
	)
	if err := r.Scan(&state, &row.workflow, &row.fingerprint, &row.result, &live, &row.locked, &row.leaseLeft); err != nil {
		return keyRow{}, fmt.Errorf("idem: error looking up key: %w", err)
	}
	if state != nil {
		row.found, row.state = true, *state
		row.live = live != nil && *live
	}
	return row, nil
}

type verdict int

const (
	verdictRunFresh verdict = iota
	verdictRunExpired
	verdictReplay
)

// decide turns the looked-up row into what Do does next. It is the one place that encodes the
// outcome table in Do's doc comment.
func decide(key Key, cfg *config, row keyRow) (verdict, error) {
	// A workflow's key is another operation's until it has finished and expired.
	if row.found && row.workflow != nil && (row.live || row.state == "running") {
		return 0, fmt.Errorf("%w (it belongs to workflow %q; scope %q, key %q): use a new key", ErrMismatch, *row.workflow, key.Scope, key.ID)
	}
	switch {
	case row.found && row.live && row.state == "done":
		if key.Fingerprint != nil && row.fingerprint != nil && string(key.Fingerprint) != string(row.fingerprint) {
			return 0, fmt.Errorf("%w (scope %q, key %q): use a new key for a new request", ErrMismatch, key.Scope, key.ID)
		}
		return verdictReplay, nil
	case row.found && (row.live || row.state == "running"):
		return 0, inFlight(key, cfg, row.leaseLeft)
	case !row.locked:
		return 0, inFlight(key, cfg, nil)
	case row.found:
		return verdictRunExpired, nil
	default:
		return verdictRunFresh, nil
	}
}

func inFlight(key Key, cfg *config, leaseLeft *int32) error {
	after := cfg.retryAfter
	if leaseLeft != nil && time.Duration(*leaseLeft)*time.Second > after {
		after = time.Duration(*leaseLeft) * time.Second
	}
	return &InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: after}
}

// waitFor runs step, and while it reports the key in flight and the Wait bound allows, runs it
// again after a short, growing pause. Polling with pg_try_advisory_xact_lock rather than blocking
// in pg_advisory_xact_lock keeps the transaction usable when the bound runs out: a blocked lock
// could only be interrupted by lock_timeout or a cancel, and both abort the transaction.
func waitFor(ctx context.Context, cfg *config, step func() error) error {
	err := step()
	if cfg.wait <= 0 || !errors.Is(err, ErrInFlight) {
		return err
	}
	deadline := time.Now().Add(cfg.wait)
	pause := 5 * time.Millisecond
	for errors.Is(err, ErrInFlight) {
		left := time.Until(deadline)
		if left <= 0 {
			return err
		}
		timer := time.NewTimer(min(pause, left))
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("idem: gave up waiting for key in flight: %w", ctx.Err())
		case <-timer.C:
		}
		pause = min(pause*2, 100*time.Millisecond)
		err = step()
	}
	return err
}

func marshalResult(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("idem: error encoding result of type %T as JSON: %w", v, err)
	}
	return data, nil
}

func decodeResult[T any](key Key, data []byte) (T, error) {
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return v, fmt.Errorf("idem: stored result of key %q in scope %q cannot be decoded into %T (did the result type change?): %w", key.ID, key.Scope, v, err)
	}
	return v, nil
}

// storeError explains a failed write of the result. A unique violation on the key means a racing
// duplicate committed first; Postgres has aborted the transaction, and a retry will replay.
func storeError(key Key, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "idem_keys_pkey" {
		return &InFlightError{Scope: key.Scope, ID: key.ID, Race: true, cause: err}
	}
	return fmt.Errorf("idem: error storing result: %w", err)
}
