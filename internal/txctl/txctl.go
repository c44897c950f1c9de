// Package txctl is the link between tx.Run and the code that runs inside its transactions
// (idem.Do, workflow steps): the pgx.Tx that tx.Run hands to fn carries an *Attempt, and Do finds
// it there, whatever context it was given. Through it Do declares the transaction safe to rerun
// after a lost COMMIT, learns that it is such a rerun, and hands tx.Run its key write to send in
// the same round trip as COMMIT.
package txctl

import (
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Attempt is one attempt of tx.Run: one transaction.
type Attempt struct {
	// Rerun is true when an earlier attempt's COMMIT went unanswered, so it may have landed.
	Rerun bool

	// Prev is the error that ended the previous attempt, nil for the first.
	Prev error

	idempotent atomic.Bool
	parent     *Attempt // set for a savepoint's attempt

	mu      sync.Mutex
	pending []Deferred
	memo    map[any]any
	failed  error
}

// Deferred is a write that tx.Run sends after everything fn did, in the round trip of COMMIT.
type Deferred struct {
	SQL  string
	Args []any
	// MapErr turns the statement's error into the one tx.Run reports (idem.Do turns a duplicate
	// key into a retryable race). nil keeps the error as it is.
	MapErr func(error) error
}

// MarkIdempotent declares the transaction safe to run again after a COMMIT whose outcome is
// unknown.
func (a *Attempt) MarkIdempotent() { a.idempotent.Store(true) }

// Idempotent reports whether MarkIdempotent was called.
func (a *Attempt) Idempotent() bool { return a.idempotent.Load() }

// Child returns the attempt of a savepoint of a's transaction.
func (a *Attempt) Child() *Attempt { return &Attempt{Rerun: a.Rerun, Prev: a.Prev, parent: a} }

// Released passes a savepoint's mark on to the enclosing transaction, once the savepoint's writes
// are part of it: a savepoint that was rolled back leaves no promise behind.
func (a *Attempt) Released() {
	if a.parent != nil && a.Idempotent() {
		a.parent.MarkIdempotent()
	}
}

func (a *Attempt) root() *Attempt {
	for a.parent != nil {
		a = a.parent
	}
	return a
}

// Queue adds d to the writes sent with COMMIT.
func (a *Attempt) Queue(d Deferred) {
	a.mu.Lock()
	a.pending = append(a.pending, d)
	a.mu.Unlock()
}

// TakePending returns the queued writes and forgets them.
func (a *Attempt) TakePending() []Deferred {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pending
	a.pending = nil
	return p
}

// Memo returns what SetMemo stored under k in this attempt.
func (a *Attempt) Memo(k any) (any, bool) {
	a = a.root()
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.memo[k]
	return v, ok
}

// SetMemo stores v under k for the rest of this attempt. Do keeps there the results whose
// writes are queued, so that a second Do with the same key in the same transaction replays.
func (a *Attempt) SetMemo(k, v any) {
	a = a.root()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.memo == nil {
		a.memo = map[any]any{}
	}
	a.memo[k] = v
}

// Fail marks the attempt's transaction as one that must not commit: fn tried to end it, or
// ended it through the raw connection. The first error is kept; every later statement, Do's
// key write and the COMMIT are refused with it.
func (a *Attempt) Fail(err error) {
	a = a.root()
	a.mu.Lock()
	if a.failed == nil {
		a.failed = err
	}
	a.mu.Unlock()
}

// Err returns what Fail recorded, nil if nothing did.
func (a *Attempt) Err() error {
	a = a.root()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.failed
}

// Carrier is implemented by the transactions tx.Run hands out.
type Carrier interface {
	// TxAttempt returns the attempt, and whether writes may be queued for COMMIT on this
	// transaction (not on a savepoint, not after fn took the raw connection or sent its own
	// transaction control).
	TxAttempt() (a *Attempt, canDefer bool)
}

// From returns the attempt t belongs to, if t comes from tx.Run.
func From(t pgx.Tx) (a *Attempt, canDefer bool) {
	if c, ok := t.(Carrier); ok {
		return c.TxAttempt()
	}
	return nil, false
}
