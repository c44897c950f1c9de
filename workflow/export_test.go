package workflow

import (
	"context"
	"time"

	"github.com/idemkit/idem"
)

// PauseHeartbeat stops e's lease renewals, as if its process were paused: the test for a stale
// worker needs a lease that expires while its owner is still running.
func PauseHeartbeat(e *Engine) { e.heartbeatOff.Store(true) }

// Reap runs one reap job's work.
func Reap(ctx context.Context, e *Engine) (int64, error) {
	return idem.Reap(ctx, e.db, idem.Schema(e.cfg.Schema))
}

// StopOwnScan stops e's own recovery scan, so that only River's leader scans, as before the
// engines scanned by themselves: the recovery benchmark's baseline.
func StopOwnScan(e *Engine) {
	e.bg.mu.Lock()
	cancel, done := e.bg.cancel, e.bg.done
	e.bg.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// SetScheduleClock makes e's schedules go by now instead of Postgres's clock: the tests move
// through ticks without waiting for them.
func SetScheduleClock(e *Engine, now func() time.Time) { e.schedClock.Store(&now) }

// FireSchedules runs one pass of e's scheduler, as its loop does.
func FireSchedules(ctx context.Context, e *Engine) error {
	_, err := e.fireSchedules(ctx)
	return err
}
