// Package txwatch wraps the transaction that idemhttp and idemgrpc hand to a handler, so that a
// retryable error the handler saw (and may have answered with any status, or swallowed) still
// makes the whole attempt run again.
package txwatch

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/tx"
)

// Tx is the pgx.Tx a handler gets. It passes everything through and notes the first retryable
// error (serialization failure, deadlock) any statement reports.
//
// Why: a handler answers with a status, not an error. One that hits a serialization failure
// typically answers 500 (or Internal, or Aborted), or even swallows the error; either way
// Postgres has aborted the transaction, and the right move is what tx.Run does for any function:
// run the whole attempt again. The middleware or interceptor checks Retryable after the handler
// returns and, when set, hands the error to tx.Run, which runs the handler again, so the client
// never sees the failed attempt.
type Tx struct {
	pgx.Tx
	w     *watch
	owned error // for the top transaction, which the handler must not end: what Commit and Rollback say
}

// New wraps t, the transaction of one attempt; Commit and Rollback on it return owned, since
// the caller ends it when the handler returns.
func New(t pgx.Tx, owned error) *Tx { return &Tx{Tx: t, w: &watch{}, owned: owned} }

// Retryable returns the first retryable error a statement reported, nil if none did.
func (t *Tx) Retryable() error { return t.w.retryable() }

type watch struct {
	mu  sync.Mutex
	err error
}

func (w *watch) note(err error) {
	if err == nil || !tx.IsRetryable(err) {
		return
	}
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

func (w *watch) retryable() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := t.Tx.Begin(ctx)
	t.w.note(err)
	if err != nil {
		return nil, err
	}
	return &Tx{Tx: sp, w: t.w}, nil
}

func (t *Tx) Commit(ctx context.Context) error {
	if t.owned != nil {
		return t.owned
	}
	err := t.Tx.Commit(ctx)
	t.w.note(err)
	return err
}

func (t *Tx) Rollback(ctx context.Context) error {
	if t.owned != nil {
		return t.owned
	}
	return t.Tx.Rollback(ctx)
}

func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	n, err := t.Tx.CopyFrom(ctx, table, columns, src)
	t.w.note(err)
	return n, err
}

func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return &watchedBatch{BatchResults: t.Tx.SendBatch(ctx, b), w: t.w}
}

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := t.Tx.Exec(ctx, sql, args...)
	t.w.note(err)
	return tag, err
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := t.Tx.Query(ctx, sql, args...)
	t.w.note(err)
	if err != nil {
		return rows, err
	}
	return &watchedRows{Rows: rows, w: t.w}, nil
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &watchedRow{row: t.Tx.QueryRow(ctx, sql, args...), w: t.w}
}

type watchedRows struct {
	pgx.Rows
	w *watch
}

// Close notes the error too, for callers that close without asking Err.
func (r *watchedRows) Close() {
	r.Rows.Close()
	r.w.note(r.Rows.Err())
}

func (r *watchedRows) Err() error {
	err := r.Rows.Err()
	r.w.note(err)
	return err
}

type watchedRow struct {
	row pgx.Row
	w   *watch
}

func (r *watchedRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.w.note(err)
	return err
}

type watchedBatch struct {
	pgx.BatchResults
	w *watch
}

func (b *watchedBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := b.BatchResults.Exec()
	b.w.note(err)
	return tag, err
}

func (b *watchedBatch) Query() (pgx.Rows, error) {
	rows, err := b.BatchResults.Query()
	b.w.note(err)
	if err != nil {
		return rows, err
	}
	return &watchedRows{Rows: rows, w: b.w}, nil
}

func (b *watchedBatch) QueryRow() pgx.Row {
	return &watchedRow{row: b.BatchResults.QueryRow(), w: b.w}
}

func (b *watchedBatch) Close() error {
	err := b.BatchResults.Close()
	b.w.note(err)
	return err
}
