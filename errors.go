package idem

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrInFlight means the key is being worked on right now, by another transaction or a
	// running workflow. Nothing ran. Retry later with the same key: the retry replays the result
	// once the other one has committed, or runs afresh if it rolled back. The error is an
	// *InFlightError carrying a retry-after hint.
	//
	//	var inflight *idem.InFlightError
	//	if errors.As(err, &inflight) {
	//		w.Header().Set("Retry-After", strconv.Itoa(int(inflight.RetryAfter.Seconds())))
	//	}
	ErrInFlight = errors.New("idem: key is in flight")

	// ErrMismatch means the key was used before for a different request (the fingerprints
	// differ). Nothing ran and nothing was replayed: a client reusing a key for a new request
	// has a bug, and answering it with the old request's result would hide that bug.
	//
	//	if errors.Is(err, idem.ErrMismatch) { ... } // 422 Unprocessable Content
	ErrMismatch = errors.New("idem: key was used for a different request")

	// ErrInvalidKey means the Key is malformed. It is returned before any SQL runs; the error is
	// an *InvalidKeyError that says what is wrong.
	//
	//	if errors.Is(err, idem.ErrInvalidKey) { ... } // 400 Bad Request
	ErrInvalidKey = errors.New("idem: invalid key")
)

// InFlightError is the error behind [ErrInFlight].
//
// Race is true when this transaction lost a race it could not see at its start: another
// transaction completed the same key after this one's snapshot was taken. The transaction has
// been aborted by Postgres (so nothing it did can commit); roll back and retry, and the retry
// replays the other transaction's result. tx.Run does that by itself, because the error is
// retryable.
//
//	var inflight *idem.InFlightError
//	if errors.As(err, &inflight) && !inflight.Race {
//		w.Header().Set("Retry-After", strconv.Itoa(int(inflight.RetryAfter.Seconds())))
//		w.WriteHeader(http.StatusConflict)
//	}
type InFlightError struct {
	Scope, ID  string
	RetryAfter time.Duration // a hint for when to try again; at least one second when not a race
	Race       bool
	cause      error
}

// Error implements error.
func (e *InFlightError) Error() string {
	if e.Race {
		return fmt.Sprintf("idem: key %q in scope %q was completed by a concurrent transaction; roll back and retry to get its result", e.ID, e.Scope)
	}
	return fmt.Sprintf("idem: key %q in scope %q is in flight in another transaction; retry after %s", e.ID, e.Scope, e.RetryAfter)
}

// Is makes errors.Is(err, ErrInFlight) true.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// Unwrap returns the Postgres error behind a race, if any.
func (e *InFlightError) Unwrap() error { return e.cause }

// Retryable reports whether retrying the whole transaction is the right response. tx.Run
// consults it. An ordinary in-flight error is not retried by tx.Run (the other transaction may
// take long; the caller decides how to wait), a lost race is.
func (e *InFlightError) Retryable() bool { return e.Race }
