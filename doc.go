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
// # Cost
//
// Do adds two statements to the caller's transaction: a lookup that also takes the key's
// in-flight lock, and the key's INSERT. Run sends BEGIN with the lookup and the INSERT with
// COMMIT, so it costs what a hand-rolled key table costs, without a round trip of its own: in
// scripts/bench (a transfer of two UPDATEs and an INSERT, 8 clients, durable commits, client and
// Postgres on the same two cores) Run ran at 0.69–0.87 of the bare transaction's throughput and
// the hand-rolled table at 0.67–0.86; with [Optimistic], which drops the lookup, 0.75–0.99. A
// replay is one statement, 4–5.6 times the bare transaction's throughput. Expired keys cost
// nothing until [Reap] deletes them: 5,000,000 of them left a fresh key's cost unchanged.
//
// [Do] and [Run] record spans and metrics through the OpenTelemetry API ([TracerProvider],
// [MeterProvider]); no record carries a key's ID, only its hash, unless [RecordKeys] is given.
//
// [KeyGet] shows what is stored under a key, [KeyList] pages through a scope's keys, and
// [KeyDelete] forgets a stored result so that the key runs again.
//
// Tables are created by [Migrate] from the embedded schema.sql, which migration tools can also
// apply as is.
package idem
