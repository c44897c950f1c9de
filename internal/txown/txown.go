// Package txown is the transaction that idem holds on a connection of its own: BEGIN sent with
// the first statement, writes queued by idem.Do and by workflow steps sent with COMMIT, and
// COMMIT itself left to the holder (tx.Run, or a workflow step that keeps its transaction open
// until the run's next step). Package tx documents the behaviour; this package has the one
// implementation both use.
package txown

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/txctl"
)

// Tx is the pgx.Tx that tx.Run hands to fn when Run holds the connection itself (db is a
// *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn). It saves the round trips a transaction spends on
// its own bookkeeping:
//
//   - BEGIN is not sent on its own: it travels in one pipelined batch with fn's first statement
//     (pgx's Batch.BeginTx). A fn that sends nothing costs no round trip at all.
//   - Writes queued with txctl (idem.Do's key, a workflow step's checkpoint) travel in one batch
//     with COMMIT, after everything fn did.
//
// fn cannot end the transaction itself: Commit and Rollback return an error. Once fn has
// returned, the view is closed, so that a reference kept past fn cannot reach a connection that
// may be back in the pool.
type Tx struct {
	conn    *pgx.Conn
	opts    pgx.TxOptions
	attempt *txctl.Attempt

	real    pgx.Tx // nil until BEGIN has been sent
	noDefer bool   // fn took control of the connection or of the transaction; write at once
	closed  atomic.Bool
	broken  error // from Conn, which cannot return it; reported at COMMIT
}

// ErrOwned is returned by Commit and Rollback: the holder ends the transaction.
var ErrOwned = errors.New("tx: Run commits or rolls back its transaction when fn returns; return an error from fn to roll back")

// ErrTxControl is the failure of an attempt in which fn tried to end the transaction it was
// given: a COMMIT, ROLLBACK, END, ABORT or PREPARE TRANSACTION, in any spelling and through any
// method. Such a statement is refused before it is sent (a COMMIT that went out could not be
// taken back: fn's writes would commit without what idem.Do writes after fn), and from then on
// the attempt cannot commit: later statements and the COMMIT return the same error, and the
// transaction is rolled back. A transaction that ended anyway (fn sent the statement through the
// raw connection, Conn) fails the same way at its next statement or at COMMIT.
var ErrTxControl = errors.New("tx: fn cannot end the transaction it was given; return nil from fn to commit, an error to roll back")

func refused(sql string) error {
	return fmt.Errorf("%w: %q was refused before it was sent, and the attempt is rolled back", ErrTxControl, excerpt(sql))
}

var errEnded = fmt.Errorf("%w: the transaction ended inside fn (through the raw connection), so nothing more of the attempt is sent and none of it commits", ErrTxControl)

// excerpt keeps an error about a statement short.
func excerpt(sql string) string {
	const n = 80
	if len(sql) <= n {
		return sql
	}
	return sql[:n] + "…"
}

// stdStrings reports the session's standard_conforming_strings, which decides how a backslash
// in '...' is read; on (the default since Postgres 9.1) when the server did not say.
func stdStrings(conn *pgx.Conn) bool {
	return conn == nil || conn.PgConn().ParameterStatus("standard_conforming_strings") != "off"
}

// checkSQL refuses sql when it would end the transaction, and records that in a. conn is asked
// for only when a backslash makes the session's string syntax matter.
func checkSQL(a *txctl.Attempt, conn func() *pgx.Conn, sql string) (control, error) {
	if err := a.Err(); err != nil {
		return controlNone, err
	}
	std := true
	if strings.IndexByte(sql, '\\') >= 0 {
		std = stdStrings(conn())
	}
	c := scanControl(sql, std)
	if c == controlEnds {
		err := refused(sql)
		a.Fail(err)
		return c, err
	}
	return c, nil
}

// endedOn reports, and records in a, a transaction that has ended on conn although its holder
// did not end it: the connection is idle, outside any transaction block.
func endedOn(a *txctl.Attempt, conn *pgx.Conn) error {
	if err := a.Err(); err != nil {
		return err
	}
	if conn == nil || conn.IsClosed() || conn.PgConn().IsBusy() || conn.PgConn().TxStatus() != 'I' {
		return nil
	}
	a.Fail(errEnded)
	return errEnded
}

// New returns the transaction of one attempt on conn, not begun yet.
func New(conn *pgx.Conn, opts pgx.TxOptions, a *txctl.Attempt) *Tx {
	return &Tx{conn: conn, opts: opts, attempt: a}
}

// Begun returns the transaction of one attempt on conn whose BEGIN has been sent already: real is
// the transaction that a batch begun with pgx's Batch.BeginTx began, together with statements of
// the caller's own (a workflow run's start).
func Begun(conn *pgx.Conn, opts pgx.TxOptions, a *txctl.Attempt, real pgx.Tx) *Tx {
	return &Tx{conn: conn, opts: opts, attempt: a, real: real}
}

// Close ends the view: every later use returns pgx.ErrTxClosed.
func (t *Tx) Close() { t.closed.Store(true) }

// Attempt returns the attempt the transaction belongs to.
func (t *Tx) Attempt() *txctl.Attempt { return t.attempt }

// TxAttempt implements txctl.Carrier.
func (t *Tx) TxAttempt() (*txctl.Attempt, bool) { return t.attempt, !t.noDefer }

// begun sends BEGIN on its own, if it has not gone yet.
func (t *Tx) begun(ctx context.Context) (pgx.Tx, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	if t.real != nil {
		return t.real, nil
	}
	real, err := t.conn.BeginTx(ctx, t.opts)
	if err != nil {
		return nil, &Unsent{fmt.Errorf("tx: error beginning transaction: %w", err)}
	}
	t.real = real
	return real, nil
}

// takeControl is called before fn does something the view cannot follow (raw transaction
// control, its own batches, the raw connection): the queued writes go out now, in order, and
// later ones are written at once.
func (t *Tx) takeControl(ctx context.Context) error {
	t.noDefer = true
	pending := t.attempt.TakePending()
	if len(pending) == 0 {
		return nil
	}
	real, err := t.begun(ctx)
	if err != nil {
		return err
	}
	for _, d := range pending {
		if _, err := real.Exec(ctx, d.SQL, d.Args...); err != nil {
			return mapDeferred(d, err)
		}
	}
	return nil
}

// batchable reports whether a statement can ride with BEGIN in one batch: pgx runs statements
// without arguments through the simple protocol, which allows several statements in one string,
// and a batch does not; and a batch takes no per-query execution mode.
func batchable(args []any) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// guard runs before each statement fn sends: a closed view, a failed attempt, a transaction that
// ended under the view and a statement that would end it are refused; savepoint control sends the
// queued writes first, so that they do not move past it.
func (t *Tx) guard(ctx context.Context, sql string) error {
	if t.closed.Load() {
		return pgx.ErrTxClosed
	}
	if err := t.ended(); err != nil {
		return err
	}
	c, err := checkSQL(t.attempt, func() *pgx.Conn { return t.conn }, sql)
	if err != nil {
		return err
	}
	if c == controlSavepoint {
		return t.takeControl(ctx)
	}
	return nil
}

// ended reports a transaction that ended although nobody ended it through the view.
func (t *Tx) ended() error {
	if t.real == nil {
		return t.attempt.Err()
	}
	return endedOn(t.attempt, t.conn)
}

// TxEnded reports whether fn ended the transaction, or tried to: then it must not commit, and
// nothing may be written in it.
func (t *Tx) TxEnded() error { return t.ended() }

// sendWithBegin sends BEGIN and one statement in one batch, and returns the batch positioned on
// the statement's result.
func (t *Tx) sendWithBegin(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.BeginTx(t.opts)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		var prep pgx.ErrPreprocessingBatch
		if errors.As(err, &prep) && IsServerError(err) {
			// The server refused to prepare the statement (a missing table, a syntax error):
			// nothing ran, and the error is the statement's, not BEGIN's.
			return nil, err
		}
		return nil, &Unsent{fmt.Errorf("tx: error beginning transaction: %w", err)}
	}
	t.real = br.Tx()
	return br, nil
}

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.guard(ctx, sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer func() { _ = t.ended() }()
	if t.real == nil && batchable(args) {
		br, err := t.sendWithBegin(ctx, sql, args)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return tag, err
	}
	real, err := t.begun(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return real.Exec(ctx, sql, args...)
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.guard(ctx, sql); err != nil {
		return nil, err
	}
	if t.real == nil && batchable(args) {
		br, err := t.sendWithBegin(ctx, sql, args)
		if err != nil {
			return nil, err
		}
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return nil, err
		}
		return &batchRows{Rows: rows, br: br}, nil
	}
	real, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return real.Query(ctx, sql, args...)
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.guard(ctx, sql); err != nil {
		return errRow{err}
	}
	if t.real == nil && batchable(args) {
		br, err := t.sendWithBegin(ctx, sql, args)
		if err != nil {
			return errRow{err}
		}
		return &batchRow{br: br}
	}
	real, err := t.begun(ctx)
	if err != nil {
		return errRow{err}
	}
	return real.QueryRow(ctx, sql, args...)
}

// Begin starts a pseudo nested transaction (a savepoint), as pgx.Tx does.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ended(); err != nil {
		return nil, err
	}
	real, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return savepoint(ctx, real, t.attempt)
}

// Commit is refused: Run commits when fn returns.
func (t *Tx) Commit(context.Context) error { return ErrOwned }

// Rollback is refused: return an error from fn, and Run rolls back.
func (t *Tx) Rollback(context.Context) error { return ErrOwned }

func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ended(); err != nil {
		return 0, err
	}
	real, err := t.begun(ctx)
	if err != nil {
		return 0, err
	}
	return real.CopyFrom(ctx, table, columns, src)
}

func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if err := t.guard(ctx, q.SQL); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
	}
	if err := t.takeControl(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	real, err := t.begun(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return real.SendBatch(ctx, b)
}

func (t *Tx) LargeObjects() pgx.LargeObjects {
	real, err := t.begun(context.Background())
	if err != nil {
		return pgx.LargeObjects{}
	}
	return real.LargeObjects()
}

func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.guard(ctx, sql); err != nil {
		return nil, err
	}
	real, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return real.Prepare(ctx, name, sql)
}

// Conn returns the underlying connection, after sending BEGIN and the queued writes: whatever fn
// does with it directly, the view can no longer tell.
func (t *Tx) Conn() *pgx.Conn {
	ctx := context.Background()
	if err := t.takeControl(ctx); err != nil {
		t.broken = err
	}
	if _, err := t.begun(ctx); err != nil {
		t.broken = err
	}
	return t.conn
}

// CommitNow sends the queued writes and COMMIT in one batch (with BEGIN, if fn sent nothing).
func (t *Tx) CommitNow(ctx context.Context) error {
	if t.broken != nil {
		return t.broken
	}
	if err := t.ended(); err != nil {
		t.attempt.TakePending() // written in no transaction, they would commit on their own
		return err
	}
	pending := t.attempt.TakePending()
	if t.real == nil && len(pending) == 0 {
		return nil // nothing was sent, so there is nothing to commit
	}
	if t.conn.IsClosed() {
		// pgx sends nothing on a closed connection, and the server ended the transaction when
		// the connection went.
		return &Unsent{errors.New("tx: the connection closed before COMMIT was sent, so the transaction was rolled back")}
	}
	b := &pgx.Batch{}
	if t.real == nil {
		b.BeginTx(t.opts)
	}
	for _, d := range pending {
		b.Queue(d.SQL, d.Args...)
	}
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, b)
	defer br.Close()
	if t.real == nil {
		if _, err := br.Exec(); err != nil {
			return t.outcome(fmt.Errorf("tx: error beginning transaction: %w", err))
		}
	}
	for _, d := range pending {
		if _, err := br.Exec(); err != nil {
			return t.outcome(mapDeferred(d, err))
		}
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		wrapped, _ := CommitError(err)
		return wrapped
	}
	if tag.String() != "COMMIT" {
		return fmt.Errorf("tx: error committing transaction: a statement in it failed, so Postgres rolled it back: %w", pgx.ErrTxCommitRollback)
	}
	return nil
}

// outcome reports an error that came before COMMIT's answer in the commit batch. An ERROR from
// the server means the rest of the batch was skipped and nothing committed. Anything else (a lost
// connection) leaves the COMMIT's outcome unknown: the whole batch was sent, and the server may
// have run all of it before the answers were lost.
func (t *Tx) outcome(err error) error {
	if IsServerError(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrCommitUnknown, err)
}

func mapDeferred(d txctl.Deferred, err error) error {
	if d.MapErr != nil {
		return d.MapErr(err)
	}
	return err
}

// IsServerError reports whether Postgres answered with an ERROR, so that the statement, and the
// transaction, are known to have failed.
func IsServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && Severity(pgErr) == "ERROR"
}

// RollbackNow ends the transaction, if one is open on the connection, and closes a connection
// that cannot even do that.
func (t *Tx) RollbackNow(ctx context.Context) {
	if t.conn.IsClosed() || t.conn.PgConn().TxStatus() == 'I' {
		return
	}
	if _, err := t.conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = t.conn.Close(ctx)
	}
}

// batchRows is the result of a Query that was sent together with BEGIN: the batch ends with the
// rows.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closed   bool
	closeErr error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if !r.closed {
		r.closed = true
		r.closeErr = r.br.Close()
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

// batchRow is the result of a QueryRow that was sent together with BEGIN.
type batchRow struct{ br pgx.BatchResults }

func (r *batchRow) Scan(dest ...any) error {
	err := r.br.QueryRow().Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// errRow answers for a transaction that has ended, as pgx's own does.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// Guard is a transaction that someone else began, as fn sees it: the transaction db began
// (tx.Run with a Beginner it cannot hold itself), or the caller's own transaction that idem.Do
// hands its fn. It carries the attempt, refuses statements that would end the transaction (see
// [ErrTxControl]), and refuses Commit and Rollback: whoever began it ends it. Writes are not
// queued: the holder cannot send them with COMMIT.
type Guard struct {
	pgx.Tx
	Attempt *txctl.Attempt
}

// Plain is the name the workflow engine knows Guard by: the view of a transaction that another
// DB than a pool began, whose holder commits it through the transaction itself.
type Plain = Guard

// NewGuard returns t as fn sees it, in attempt a (a new one when nil).
func NewGuard(t pgx.Tx, a *txctl.Attempt) *Guard {
	if a == nil {
		a = &txctl.Attempt{}
	}
	return &Guard{Tx: t, Attempt: a}
}

// TxAttempt implements txctl.Carrier.
func (g *Guard) TxAttempt() (*txctl.Attempt, bool) { return g.Attempt, false }

// TxEnded reports whether fn ended the transaction, or tried to.
func (g *Guard) TxEnded() error { return endedOn(g.Attempt, g.Tx.Conn()) }

func (g *Guard) check(sql string) error {
	_, err := checkSQL(g.Attempt, g.Tx.Conn, sql)
	return err
}

func (g *Guard) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := g.check(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	return g.Tx.Exec(ctx, sql, args...)
}

func (g *Guard) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := g.check(sql); err != nil {
		return nil, err
	}
	return g.Tx.Query(ctx, sql, args...)
}

func (g *Guard) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := g.check(sql); err != nil {
		return errRow{err}
	}
	return g.Tx.QueryRow(ctx, sql, args...)
}

func (g *Guard) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if err := g.check(q.SQL); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
	}
	return g.Tx.SendBatch(ctx, b)
}

func (g *Guard) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := g.check(sql); err != nil {
		return nil, err
	}
	return g.Tx.Prepare(ctx, name, sql)
}

// Begin starts a savepoint.
func (g *Guard) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := g.Attempt.Err(); err != nil {
		return nil, err
	}
	return savepoint(ctx, g.Tx, g.Attempt)
}

// Commit is refused: the transaction's holder commits it.
func (g *Guard) Commit(context.Context) error { return ErrOwned }

// Rollback is refused: return an error from fn, and the holder rolls back.
func (g *Guard) Rollback(context.Context) error { return ErrOwned }

// Savepoint is a savepoint of a transaction of Run's: it carries its own attempt, whose
// MarkIdempotent reaches the enclosing transaction once the savepoint is released. Its Commit
// releases it and its Rollback rolls back to it; statements that would end the enclosing
// transaction are refused as in the transaction itself.
type Savepoint struct{ Guard }

// Begin starts a savepoint inside this one.
func (t *Savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.Attempt.Err(); err != nil {
		return nil, err
	}
	return savepoint(ctx, t.Tx, t.Attempt)
}

// Commit releases the savepoint.
func (t *Savepoint) Commit(ctx context.Context) error {
	if err := t.Attempt.Err(); err != nil {
		return err
	}
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	t.Attempt.Released()
	return nil
}

// Rollback rolls back to the savepoint.
func (t *Savepoint) Rollback(ctx context.Context) error { return t.Tx.Rollback(ctx) }

// NewSavepoint wraps sp, a savepoint of some transaction, with attempt a.
func NewSavepoint(sp pgx.Tx, a *txctl.Attempt) *Savepoint {
	return &Savepoint{Guard{Tx: sp, Attempt: a}}
}

// savepoint opens a savepoint in t, which carries a child of a: what fn does in it may be
// rolled back without the attempt's own queued writes and marks.
func savepoint(ctx context.Context, t pgx.Tx, a *txctl.Attempt) (pgx.Tx, error) {
	sp, err := t.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return NewSavepoint(sp, a.Child()), nil
}

// Ended reports whether the transaction fn was given (one of this package's) was ended by fn, or
// fn tried to; nil for other transactions, whose connection Ended reads instead. idem.Do asks
// before it writes the key: a key written outside the transaction would commit on its own.
func Ended(t pgx.Tx) error {
	if e, ok := t.(interface{ TxEnded() error }); ok {
		return e.TxEnded()
	}
	return endedOn(&txctl.Attempt{}, t.Conn())
}

// Unsent is a failure before anything of an attempt could commit: its BEGIN failed, or its
// connection closed before COMMIT was sent. A lost connection then is worth another attempt on
// a new one.
type Unsent struct{ err error }

func (e *Unsent) Error() string { return e.err.Error() }
func (e *Unsent) Unwrap() error { return e.err }

// ErrCommitUnknown is tx.ErrCommitUnknown; see there.
var ErrCommitUnknown = errors.New("the COMMIT was sent but its outcome is unknown: the transaction may or may not have committed; check before retrying")

// CommitError turns a failed COMMIT into the error tx.Run reports, and says whether the outcome
// is unknown.
//
// Only an answer from the server makes the outcome known. pgconn.SafeToRetry is no guide: when
// the connection dies while pgx waits for the answer to COMMIT, pgx (v5.12) closes the
// connection and then reports the failed read as "conn closed" (pgconn.ErrConnClosed), a lock
// error that SafeToRetry calls safe, though the server may well have committed.
func CommitError(err error) (wrapped error, unknown bool) {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrTxCommitRollback):
		// The server answered ROLLBACK: a statement failed earlier in the transaction and fn
		// did not return its error.
		return fmt.Errorf("tx: error committing transaction: a statement in it failed, so Postgres rolled it back: %w", err), false

	case errors.Is(err, pgx.ErrTxClosed):
		// Nothing was sent: the transaction ended before Run committed it.
		return fmt.Errorf("tx: error committing transaction: fn must not commit or roll back the transaction Run gives it: %w", err), false

	case errors.As(err, &pgErr) && Severity(pgErr) == "ERROR":
		// An ERROR in reply to COMMIT (a deferred constraint, a serialization failure) means
		// the transaction was rolled back. FATAL and PANIC are not included: a backend
		// terminated while waiting for a synchronous standby reports FATAL after the commit is
		// already durable locally.
		return fmt.Errorf("tx: error committing transaction: %w", err), false

	default:
		return fmt.Errorf("%w: %w", ErrCommitUnknown, err), true
	}
}

// Severity is the error's severity, unlocalized where the server sent it.
func Severity(pgErr *pgconn.PgError) string {
	if pgErr.SeverityUnlocalized != "" {
		return pgErr.SeverityUnlocalized
	}
	return pgErr.Severity
}
