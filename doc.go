// Package idem makes mutating operations safe to retry on Postgres: the effect happens once, and
// every retry gets the same answer.
//
// The heart of it is [Do]. It runs a function inside the caller's transaction, next to the row
// that records the idempotency key, so business writes, River jobs inserted in the same
// transaction and the stored result commit together or not at all:
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, t pgx.Tx) error {
//		receipt, err := idem.Do(ctx, t, idem.Key{Scope: customerID, ID: requestKey},
//			func(ctx context.Context, t pgx.Tx) (Receipt, error) {
//				return transfer(ctx, t, req) // runs once per key, ever
//			})
//		...
//	})
//
// A retry with the same key returns the stored result without running the function; a
// concurrent duplicate gets [ErrInFlight]; the same key with a different request gets
// [ErrMismatch]. [Run] is the same operation when idem may own the transaction, and then it adds
// no round trip to it at all.
//
// [KeyGet] shows what is stored under a key, and [KeyDelete] forgets a stored result so that
// the key runs again.
//
// Tables are created by [Migrate] from the embedded schema.sql, which migration tools can also
// apply as is.
package idem
