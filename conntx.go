package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// connTx is the pgx.Tx that Run hands to fn. Run sends BEGIN pipelined with the key lookup and
// COMMIT pipelined with the key write, which pgx's own transaction type cannot do (it waits for
// BEGIN's answer before anything else), so Run keeps the transaction on the connection itself and
// gives fn this thin view of it. Nested transactions are savepoints, as with pgx.
type connTx struct {
	conn   *pgx.Conn
	depth  int // 0 for the transaction Run owns, n for savepoint sp_n
	closed bool
}

var errOwnedByRun = errors.New("idem: Run commits or rolls back its transaction when fn returns; return an error from fn to roll back")

// Begin starts a pseudo nested transaction (a savepoint), as pgx.Tx does.
func (t *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	n := t.depth + 1
	if _, err := t.conn.Exec(ctx, fmt.Sprintf("SAVEPOINT idem_sp_%d", n)); err != nil {
		return nil, err
	}
	return &connTx{conn: t.conn, depth: n}, nil
}

// Commit releases a savepoint. On the transaction Run owns it is refused: Run commits.
func (t *connTx) Commit(ctx context.Context) error {
	if t.depth == 0 {
		return errOwnedByRun
	}
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	_, err := t.conn.Exec(ctx, fmt.Sprintf("RELEASE SAVEPOINT idem_sp_%d", t.depth))
	return err
}

// Rollback rolls back to a savepoint. On the transaction Run owns it is refused: return an
// error from fn instead. Like pgx, rolling back a closed savepoint is not an error, so the usual
// "defer tx.Rollback(ctx)" works.
func (t *connTx) Rollback(ctx context.Context) error {
	if t.depth == 0 {
		return errOwnedByRun
	}
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	_, err := t.conn.Exec(ctx, fmt.Sprintf("ROLLBACK TO SAVEPOINT idem_sp_%d", t.depth))
	return err
}

func (t *connTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (t *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects is not available in the transaction Run owns: pgx.LargeObjects can only be made
// by pgx's own transaction type. Use [Do] in a transaction you begin yourself for large objects.
func (t *connTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

func (t *connTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, arguments...)
}

func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *connTx) Conn() *pgx.Conn { return t.conn }
