package tx

import (
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/txctl"
)

// MarkIdempotent declares that the transaction t, which [Run] handed to fn, may be run again
// after a COMMIT whose outcome is unknown. Run then answers a lost COMMIT by running fn again in a
// new transaction (it counts as an attempt) instead of returning [ErrCommitUnknown]. It reports
// whether the mark took: false when t does not come from Run (or from a savepoint of Run's
// transaction), since then nobody reruns anything.
//
// Call it from fn when running the whole transaction a second time is harmless even if the first
// COMMIT did land: the transaction records what it did and a rerun finds the record and changes
// nothing. idem.Do calls it, because its rerun replays the stored result. A transaction whose
// writes are naturally idempotent can call it too:
//
//	err := tx.Run(ctx, pool, func(ctx context.Context, dbtx pgx.Tx) error {
//		tx.MarkIdempotent(dbtx) // an upsert to a fixed value: twice is once
//		_, err := dbtx.Exec(ctx,
//			"INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = $2",
//			"theme", "dark")
//		return err
//	})
//
// The mark is carried by the transaction itself, not by a context, so it cannot be lost on the
// way: fn may pass t to code that uses another context. It covers the whole transaction, not just
// the statements that follow it: one non-idempotent write anywhere in fn makes a rerun unsafe. It
// lasts for the current attempt only, so fn calls it again on each run. On a savepoint (t.Begin,
// or a nested Run), it marks the enclosing transaction once the savepoint has been released.
func MarkIdempotent(t pgx.Tx) bool {
	a, _ := txctl.From(t)
	if a == nil {
		return false
	}
	a.MarkIdempotent()
	return true
}
