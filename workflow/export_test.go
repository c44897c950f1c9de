package workflow

import (
	"context"

	"github.com/idemkit/idem"
)

// PauseHeartbeat stops e's lease renewals, as if its process were paused: the test for a stale
// worker needs a lease that expires while its owner is still running.
func PauseHeartbeat(e *Engine) { e.heartbeatOff.Store(true) }

// Reap runs one reap job's work.
func Reap(ctx context.Context, e *Engine) (int64, error) {
	return idem.Reap(ctx, e.db, idem.Schema(e.cfg.Schema))
}
