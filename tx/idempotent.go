package tx

import (
	"context"
	"sync/atomic"
)

// attempt is the state of one attempt of Run, carried in the context that
// fn receives.
type attempt struct {
	// idempotent is atomic because fn may hand its context to goroutines.
	idempotent atomic.Bool
}

type attemptKey struct{}

func withAttempt(ctx context.Context, a *attempt) context.Context {
	return context.WithValue(ctx, attemptKey{}, a)
}

// MarkIdempotent declares that the transaction [Run] is running under ctx may
// be run again after a COMMIT whose outcome is unknown. Run then answers a
// lost COMMIT by running fn again in a new transaction (it counts as an
// attempt) instead of returning [ErrCommitUnknown].
//
// Call it from fn when running the whole transaction a second time is
// harmless even if the first COMMIT did land: the transaction records what
// it did and a rerun finds the record and changes nothing. idem.Do calls it,
// because its rerun replays the stored result. A transaction whose writes are
// naturally idempotent can call it too:
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
//		tx.MarkIdempotent(ctx) // an upsert to a fixed value: twice is once
//		_, err := dbtx.Exec(ctx,
//			"INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = $2",
//			"theme", "dark")
//		return err
//	})
//
// The mark covers the whole transaction, not just the statements that follow
// it: one non-idempotent write anywhere in fn makes a rerun unsafe. It lasts
// for the current attempt only, so fn calls it again on each run. Inside a
// nested Run (Run given a pgx.Tx), it marks the enclosing transaction once
// the nested one has been released. It does nothing when ctx does not come
// from Run.
func MarkIdempotent(ctx context.Context) {
	if a, ok := ctx.Value(attemptKey{}).(*attempt); ok {
		a.idempotent.Store(true)
	}
}

type lostCommitKey struct{}

// AfterLostCommit reports whether the transaction [Run] is running under ctx
// is a rerun after a COMMIT whose outcome was unknown. The earlier attempt's
// backend may then still be alive for a moment, holding its locks until it
// notices that its client is gone; idem.Do uses this to wait for such a lock
// instead of reporting its own earlier attempt as a concurrent duplicate.
//
//	if tx.AfterLostCommit(ctx) {
//		// wait briefly for locks the lost attempt may still hold
//	}
func AfterLostCommit(ctx context.Context) bool {
	v, _ := ctx.Value(lostCommitKey{}).(bool)
	return v
}
