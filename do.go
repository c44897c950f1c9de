package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/keyctx"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/telemetry"
	"github.com/idemkit/idem/internal/txctl"
	"github.com/idemkit/idem/internal/txown"
)

// Do runs fn at most once per key, inside t, and returns its result; a later call with the same
// key returns the stored result without running fn.
//
// fn receives t, which by then holds the key: everything fn writes through it, River jobs it
// inserts with InsertTx included, commits together with the stored result, or not at all. The
// caller owns t and commits it (or lets [tx.Run] do so: it also retries the races below, and
// saves Do's round trips).
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
//   - The key belongs to a workflow run: [ErrMismatch] at once, naming the workflow.
//   - Malformed key: [ErrInvalidKey], before any SQL.
//   - Expired ([TTL], default 24h): treated as new.
//   - fn returns an error: Do returns it and stores nothing. Roll back, and the key is free again.
//     A failure that must be final (a declined card) belongs in T, so that it is stored and
//     replayed like any result.
//
// A duplicate that committed the same key after t's snapshot was taken cannot be seen by t; Do
// then runs fn, but its write is rejected by the primary key, Postgres aborts t, and the error is
// an *InFlightError with Race set (or Postgres's 40001, under REPEATABLE READ and SERIALIZABLE).
// Both are retryable: roll back, retry, and the retry replays. Two effects for one key cannot
// commit.
//
// The SQL: one statement before fn, a SELECT that reads the key's row and, unless it holds a
// live result, takes a transaction-scoped advisory lock with pg_try_advisory_xact_lock (it never
// waits). After fn, one INSERT of the result (over 1 KiB, in the same statement, a row in the
// partition of idem_results for the day the key expires: see [Reap]). A replay is the SELECT
// alone (for a result over 1 KiB, it reads it from its one partition). No row is written for
// work that does not commit, and nothing is ever updated on the fresh path, so a call leaves no
// dead tuple behind.
//
// Inside [tx.Run] (t is the transaction tx.Run handed to its function, whatever ctx Do gets) Do
// costs no round trip of its own when its lookup is the transaction's first statement: the
// lookup travels with BEGIN, and the INSERT is sent with COMMIT. The transaction is also marked
// idempotent: if the COMMIT's acknowledgement is lost, tx.Run runs it again and the second run
// replays. Everything with an effect must then happen inside fn.
//
//	type Receipt struct{ TransferID int64 }
//
//	var receipt Receipt
//	err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
//		var err error
//		receipt, err = idem.Do(ctx, t, idem.Key{Scope: "customer:42", ID: key},
//			func(ctx context.Context, t pgx.Tx) (Receipt, error) {
//				var r Receipt
//				err := t.QueryRow(ctx, `INSERT INTO transfers (amount) VALUES ($1) RETURNING id`,
//					100).Scan(&r.TransferID)
//				return r, err
//			})
//		return err
//	})
//	// answer the client with receipt, or err, here: after the COMMIT
func Do[T any](ctx context.Context, t pgx.Tx, key Key, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...Option) (T, error) {
	cfg := newConfig(opts)
	tel := telemetry.For(cfg.tracerProvider, cfg.meterProvider)
	start := time.Now()
	ctx, span := tel.Tracer.Start(ctx, "idem.Do", trace.WithSpanKind(trace.SpanKindInternal))
	out, outcome, err := do(ctx, tel, cfg, t, key, fn)
	tel.DoOutcomes.Add(ctx, 1, outcomeSets[outcome])
	tel.DoDuration.Record(ctx, time.Since(start).Seconds(), outcomeSets[outcome])
	if span.IsRecording() {
		rk := redact.Key{Scope: key.Scope, ID: key.ID}
		span.SetAttributes(telemetry.Outcome.String(outcome), telemetry.Scope.String(key.Scope), cfg.keys.Attr(rk))
		if outcome == outcomeError {
			cfg.keys.RecordError(span, err, rk)
		}
	}
	span.End()
	return out, err
}

// The outcomes of Do, as recorded in its span and metrics.
const (
	outcomeRun      = "run"
	outcomeReplay   = "replay"
	outcomeInFlight = "in_flight"
	outcomeMismatch = "mismatch"
	outcomeRace     = "race"
	outcomeInvalid  = "invalid"
	outcomeError    = "error"
)

// outcomeSets are the metric attributes of each outcome, made once: a precomputed set costs an
// instrument a fraction of what attributes built per call do.
var outcomeSets = func() map[string]metric.MeasurementOption {
	m := map[string]metric.MeasurementOption{}
	for _, o := range []string{outcomeRun, outcomeReplay, outcomeInFlight, outcomeMismatch, outcomeRace, outcomeInvalid, outcomeError} {
		m[o] = metric.WithAttributeSet(attribute.NewSet(telemetry.Outcome.String(o)))
	}
	return m
}()

// outcomeOf names the outcome of an error from Do.
func outcomeOf(err error) string {
	var inflight *InFlightError
	switch {
	case err == nil:
		return outcomeRun
	case errors.As(err, &inflight) && inflight.Race:
		return outcomeRace
	case errors.Is(err, ErrInFlight):
		return outcomeInFlight
	case errors.Is(err, ErrMismatch):
		return outcomeMismatch
	case errors.Is(err, ErrInvalidKey):
		return outcomeInvalid
	}
	return outcomeError
}

func do[T any](ctx context.Context, tel *telemetry.Set, cfg *config, t pgx.Tx, key Key, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, string, error) {
	var zero T
	if err := key.Validate(); err != nil {
		return zero, outcomeInvalid, err
	}
	if t == nil {
		return zero, outcomeError, errors.New("idem: Do needs a transaction; t is nil")
	}
	if fn == nil {
		return zero, outcomeError, errors.New("idem: Do needs a function to run; fn is nil")
	}
	if cfg.err != nil {
		return zero, outcomeError, cfg.err
	}

	attempt, canDefer := txctl.From(t)
	memo := memoKey{schema: cfg.schema, scope: key.Scope, id: key.ID}
	if attempt != nil {
		attempt.MarkIdempotent()
		if attempt.Rerun && cfg.wait < lostCommitWait {
			// The lost attempt's backend may still hold this key's lock for a moment: that is
			// not a concurrent duplicate, and the rerun should get its own answer.
			cfg.wait = lostCommitWait
		}
		if m, ok := attempt.Memo(memo); ok {
			// This transaction already ran Do for the key, and its write waits for COMMIT.
			stored := m.(memoEntry)
			if key.Fingerprint != nil && stored.fingerprint != nil && !bytes.Equal(key.Fingerprint, stored.fingerprint) {
				return zero, outcomeMismatch, mismatch(key)
			}
			out, err := decodeResult[T](key, stored.result)
			return out, outcomeReplay, err
		}
	}
	st := store.For(cfg.schema)
	lock := lockID(cfg.schema, key)

	v, row := verdictRunFresh, store.KeyRow{}
	if !cfg.optimistic || attempt == nil || lostRace(attempt.Prev, key) {
		var err error
		if v, row, err = lookup(ctx, t, st, cfg, key, lock); err != nil {
			return zero, outcomeOf(err), err
		}
	}
	if v == verdictRunKey {
		// The rare path: the key belongs to a run, which Do may only take once the run has
		// finished and expired.
		if err := takeRunKey(ctx, t, st, cfg, key, lock, *row.Workflow); err != nil {
			return zero, outcomeOf(err), err
		}
		v = verdictRunFresh
	}
	if v == verdictReplay {
		if row.ResultDay != nil && row.Result == nil {
			// A large result is in its day's partition, which is there while the key is live.
			err := fmt.Errorf("idem: the stored result of key %q in scope %q is missing from its partition of idem_results (%s)",
				key.ID, key.Scope, row.ResultDay.Format(time.DateOnly))
			return zero, outcomeError, err
		}
		out, err := decodeResult[T](key, row.Result)
		return out, outcomeReplay, err
	}

	// fn gets a transaction that refuses statements ending it (see tx.ErrTxControl): one from
	// tx.Run does already, the caller's own is wrapped. The key is written only into the
	// transaction fn's effects are in, so after fn Do checks that it is still open.
	fnTx := t
	if attempt == nil {
		fnTx = txown.NewGuard(t, nil)
	}
	out, err := fn(keyctx.With(ctx, cfg.schema, key.Scope, key.ID), fnTx)
	if err != nil {
		return zero, outcomeError, err
	}
	if err := txown.Ended(fnTx); err != nil {
		return zero, outcomeError, err
	}
	data, err := marshalResult(out)
	if err != nil {
		return zero, outcomeError, err
	}
	write := store.KeyStoreParams{Scope: key.Scope, ID: key.ID, Fingerprint: key.Fingerprint, Result: data, TTL: cfg.ttl}
	stmt := st.KeyInsert(write)
	if v == verdictRunExpired {
		stmt = st.KeyReplace(write)
	}
	if canDefer {
		attempt.Queue(txctl.Deferred{SQL: stmt.SQL, Args: stmt.Args, MapErr: func(err error) error {
			err = storeError(key, err)
			if outcomeOf(err) == outcomeRace {
				// Found at COMMIT, after Do returned: counted here.
				tel.DoOutcomes.Add(context.WithoutCancel(ctx), 1, outcomeSets[outcomeRace])
			}
			return err
		}})
		attempt.SetMemo(memo, memoEntry{fingerprint: key.Fingerprint, result: data})
	} else if _, err := stmt.Exec(ctx, t); err != nil {
		err = storeError(key, err)
		return zero, outcomeOf(err), err
	}
	out, err = decodeResult[T](key, data)
	return out, outcomeRun, err
}

// lostCommitWait bounds how long a rerun after a lost COMMIT waits for the lost attempt's
// backend to let go of the key. A backend whose client closed the connection ends in
// milliseconds; one cut off without a FIN lives until TCP keepalive notices, and then the
// rerun reports ErrInFlight, which is the truth.
const lostCommitWait = 5 * time.Second

type memoKey struct{ schema, scope, id string }

type memoEntry struct {
	fingerprint, result []byte
}

type verdict int

const (
	verdictRunFresh verdict = iota
	verdictRunExpired
	verdictReplay
	verdictRunKey
)

// lookup reads the key and decides, waiting as the Wait option allows while it is in flight.
//
// After waiting, a key found free is looked up once more. The lookup reads the row with its
// statement's snapshot and then tries the lock; the holder it waited for may have committed and
// released the lock between the two, and then only a new statement sees the row it committed
// (in READ COMMITTED; under REPEATABLE READ the snapshot stays, and the write that follows fails
// as any race does).
func lookup(ctx context.Context, t pgx.Tx, st *store.Statements, cfg *config, key Key, lock int64) (verdict, store.KeyRow, error) {
	var (
		v      verdict
		row    store.KeyRow
		waited bool
	)
	step := func() error {
		var err error
		if row, err = st.KeyLookup(ctx, t, key.Scope, key.ID, lock); err != nil {
			return lookupError(cfg, err)
		}
		v, err = decide(key, cfg, row)
		waited = waited || errors.Is(err, ErrInFlight)
		return err
	}
	err := waitFor(ctx, cfg, step)
	if err == nil && waited && (v == verdictRunFresh || v == verdictRunExpired) {
		err = step() // the lock is ours now: this one is in flight only if we are
	}
	return v, row, err
}

// decide turns the looked-up row into what Do does next. It is the one place that encodes the
// outcome table in Do's doc comment.
func decide(key Key, cfg *config, row store.KeyRow) (verdict, error) {
	switch {
	case row.Found && row.Workflow != nil:
		return verdictRunKey, nil
	case row.Found && row.Live:
		if key.Fingerprint != nil && row.Fingerprint != nil && !bytes.Equal(key.Fingerprint, row.Fingerprint) {
			return 0, mismatch(key)
		}
		return verdictReplay, nil
	case !row.Locked:
		return 0, inFlight(key, cfg)
	case row.Found:
		return verdictRunExpired, nil
	default:
		return verdictRunFresh, nil
	}
}

// takeRunKey handles a key that belongs to a workflow run: Do may take it over only when the run
// has finished and expired (then the run, its history and its key go, in t), and says so at once
// otherwise, naming the workflow, whatever the run is doing.
func takeRunKey(ctx context.Context, t pgx.Tx, st *store.Statements, cfg *config, key Key, lock int64, workflow string) error {
	rk, err := st.KeyRunKey(ctx, t, key.Scope, key.ID, lock)
	if err != nil {
		return lookupError(cfg, err)
	}
	if !rk.Reusable {
		return fmt.Errorf("%w: key %q in scope %q belongs to a run of workflow %q, not to idem.Do; use a key of its own for each (for example %q)",
			ErrMismatch, key.ID, key.Scope, workflow, key.ID+":do")
	}
	if !rk.Locked {
		return inFlight(key, cfg)
	}
	if err := st.KeyClearRun(ctx, t, key.Scope, key.ID); err != nil {
		return fmt.Errorf("idem: error clearing the expired run of key %q in scope %q: %w", key.ID, key.Scope, err)
	}
	return nil
}

func mismatch(key Key) error {
	return fmt.Errorf("%w: key %q in scope %q was first used for another request (its fingerprint differs); use a new key for a new request", ErrMismatch, key.ID, key.Scope)
}

func inFlight(key Key, cfg *config) error {
	return &InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: cfg.retryAfter}
}

// lostRace reports whether the previous attempt of this transaction lost a race on key, so that
// an optimistic Do looks before it runs fn again (and replays).
func lostRace(prev error, key Key) bool {
	var inflight *InFlightError
	return errors.As(prev, &inflight) && inflight.Race && inflight.Scope == key.Scope && inflight.ID == key.ID
}

// lookupError explains a failed lookup (see tablesError).
func lookupError(cfg *config, err error) error {
	if terr := tablesError(err); terr != err {
		return terr
	}
	return fmt.Errorf("idem: error looking up key: %w", err)
}

// tablesError explains an error that comes from a database without idem's tables, the commonest
// mistake on a new database, whose raw message does not say what to do; other errors pass.
func tablesError(err error) error {
	var pgErr *pgconn.PgError
	if store.IsMissingTable(err) && errors.As(err, &pgErr) {
		return fmt.Errorf("idem: idem's tables are missing (%s): run idem.Migrate at startup, with the same Schema option as this call, or apply schema.sql: %w", pgErr.Message, err)
	}
	return err
}

// lockID is the key's in-flight lock; see store.LockID.
func lockID(schema string, k Key) int64 { return store.LockID(schema, k.Scope, k.ID) }

// waitFor runs step, and while it reports the key in flight and the Wait bound allows, runs it
// again after a short, growing pause. Polling with pg_try_advisory_xact_lock rather than blocking
// in pg_advisory_xact_lock keeps the transaction usable when the bound runs out: a blocked lock
// could only be interrupted by lock_timeout or a cancel, and both abort the transaction.
func waitFor(ctx context.Context, cfg *config, step func() error) error {
	err := step()
	if cfg.wait <= 0 || !errors.Is(err, ErrInFlight) {
		return err
	}
	poll := backoff.NewPoll(cfg.wait, 5*time.Millisecond, 100*time.Millisecond)
	for errors.Is(err, ErrInFlight) {
		again, serr := poll.Next(ctx)
		if serr != nil {
			return fmt.Errorf("idem: gave up waiting for key in flight: %w", serr)
		}
		if !again {
			return err
		}
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
	if store.IsKeyTaken(err) {
		return &InFlightError{Scope: key.Scope, ID: key.ID, Race: true, cause: err}
	}
	return fmt.Errorf("idem: error storing result: %w", err)
}
