package idem

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ownedTx is the pgx.Tx that Run hands to fn: pgx's own transaction, begun in the batch that
// carries the key lookup (pgx's Batch.BeginTx), minus the right to end it. Run ends it itself,
// with COMMIT pipelined after the key write, and then marks this view closed, so that a
// reference kept past fn cannot reach a connection that is back in the pool.
//
// closed is atomic because the misuse it guards against is exactly a goroutine that kept t and
// uses it while Run, on its own goroutine, ends the transaction.
type ownedTx struct {
	pgx.Tx
	closed atomic.Bool
}

var errOwnedByRun = errors.New("idem: Run commits or rolls back its transaction when fn returns; return an error from fn to roll back")

// Begin starts a pseudo nested transaction (a savepoint), as pgx.Tx does.
func (t *ownedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Begin(ctx)
}

// Commit is refused: Run commits when fn returns.
func (t *ownedTx) Commit(context.Context) error { return errOwnedByRun }

// Rollback is refused: return an error from fn, and Run rolls back.
func (t *ownedTx) Rollback(context.Context) error { return errOwnedByRun }

func (t *ownedTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if t.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return t.Tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (t *ownedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t *ownedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *ownedTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if t.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.Tx.Exec(ctx, sql, arguments...)
}

func (t *ownedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *ownedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed.Load() {
		return errRow{pgx.ErrTxClosed}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

// errRow answers for a transaction that has ended, as pgx's own does.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
