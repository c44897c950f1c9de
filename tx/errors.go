package tx

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/txown"
)

// ErrCommitUnknown is wrapped by the error [Run] returns when COMMIT was sent
// but no answer came back: the connection died, the context was cancelled
// while waiting, or the server ended the session. The transaction may or may
// not have committed, and only the database can tell which. The returned
// error also wraps the cause.
//
//	err := tx.Run(ctx, pool, transfer)
//	if errors.Is(err, tx.ErrCommitUnknown) {
//		// Look before trying again: did the transfer land?
//	}
//
// Run does not return it for a transaction marked with [MarkIdempotent]: it
// runs that transaction again instead. It still returns it when it has to
// stop (the context is done, or the attempts are used up) before such a
// rerun succeeded, because then the outcome is still unknown.
var ErrCommitUnknown = txown.ErrCommitUnknown

// ErrTxControl is wrapped by the error [Run] returns when fn tried to end the transaction it
// was given: a COMMIT, ROLLBACK, END, ABORT or PREPARE TRANSACTION, however spelled (comments,
// case, several statements in one string) and however sent (Exec, Query, QueryRow, SendBatch,
// Prepare, a savepoint's methods). Such a statement is refused before it reaches the server,
// since a COMMIT that went out could not be taken back, and the attempt then cannot commit:
// its later statements fail with the same error, and Run rolls it back and returns the error
// (whether fn returned nil or not) without retrying. A transaction ended through fn's own use of
// the raw connection (Conn) is found at the next statement or at COMMIT and fails the same way.
// Savepoints stay fn's to use: SAVEPOINT, RELEASE and ROLLBACK TO, or Begin on the transaction.
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
//		_, err := dbtx.Exec(ctx, "COMMIT") // refused: return nil to commit
//		return err
//	})
//	errors.Is(err, tx.ErrTxControl) // true
var ErrTxControl = txown.ErrTxControl

// IsRetryable reports whether err means that running the same transaction
// again may succeed: a serialization failure (SQLSTATE 40001) or a deadlock
// (SQLSTATE 40P01) reported by Postgres anywhere in err's chain, or an error
// in the chain with a Retryable() bool method that returns true. [Run] uses
// it to decide whether to retry after fn fails.
//
//	if tx.IsRetryable(err) {
//		// Postgres rolled the transaction back to break a conflict.
//	}
//
// A function that wants Run to retry for reasons of its own returns an error
// with a Retryable method:
//
//	type lockBusyError struct{}
//
//	func (lockBusyError) Error() string   { return "lock is busy" }
//	func (lockBusyError) Retryable() bool { return true }
func IsRetryable(err error) bool {
	return anyInTree(err, func(err error) bool {
		if pgErr, ok := err.(*pgconn.PgError); ok {
			return pgErr.Code == "40001" || pgErr.Code == "40P01"
		}
		if r, ok := err.(interface{ Retryable() bool }); ok {
			return r.Retryable()
		}
		return false
	})
}

// anyInTree reports whether match is true for err or any error it wraps,
// following both Unwrap() error and Unwrap() []error. errors.As would stop at
// the first *pgconn.PgError, and a joined error can hold several.
func anyInTree(err error, match func(error) bool) bool {
	for err != nil {
		if match(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if anyInTree(e, match) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

func commitError(err error) (wrapped error, unknown bool) { return txown.CommitError(err) }

func severity(pgErr *pgconn.PgError) string { return txown.Severity(pgErr) }

// IsConnectionLost reports whether err means the connection to Postgres failed, rather than that
// a statement was refused: the connection closed or reset, the server ended the session
// (administrator command, crash, shutdown: SQLSTATE 57P01–57P03, class 08), or a FATAL. Before
// COMMIT was sent, such a failure leaves nothing behind, and the work can run again on a new
// connection; after, see [ErrCommitUnknown].
//
//	if tx.IsConnectionLost(err) {
//		// not the statement's fault: try again later, on another connection
//	}
func IsConnectionLost(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		sev := severity(pgErr)
		return sev == "FATAL" || sev == "PANIC" || strings.HasPrefix(pgErr.Code, "08") ||
			pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	var netErr net.Error
	return errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.As(err, &netErr) || pgconn.SafeToRetry(err)
}
