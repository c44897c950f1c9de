package workflow

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// Recovery does not wait for River's leader. River runs periodic jobs on its elected leader
// only, so a scan that is a periodic job stops when the leader dies, until another client is
// elected (many seconds later) — and the leader is as likely as any process to be the one that
// died. So every engine whose workers run in this process (AddWorkers, then SetClient) also scans
// by itself: it looks for runs whose lease expired, and for waiting runs whose wake-up is overdue,
// and inserts their resume and wake jobs, which any River client that works the engine's queue
// takes. Between scans it sleeps until the next live lease runs out (at most ScanInterval), so a
// dead process's runs are resumed moments after their lease expires. Several engines scanning at
// once do not fight: the scan locks the runs it hands out (FOR UPDATE SKIP LOCKED), the jobs are
// unique, and each engine's sleep has a little jitter.
//
// The periodic scan job (PeriodicJobs) stays, for deployments whose engines never call
// SetClient.

// background is what an engine runs beside the application: the recovery scan, and the gauge
// callback. Close stops both.
type background struct {
	mu       sync.Mutex
	cancel   context.CancelFunc
	done     chan struct{}
	closed   bool
	gauge    metric.Registration
	scanning bool
	wake     chan struct{} // wakes the loop before its sleep runs out (see poke)
}

// minScanWait bounds how often one engine scans, however soon the next lease runs out.
const minScanWait = 50 * time.Millisecond

// startScanning starts the engine's own recovery scan, once.
func (e *Engine) startScanning() {
	e.bg.mu.Lock()
	defer e.bg.mu.Unlock()
	if e.bg.scanning || e.bg.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.bg.scanning, e.bg.cancel, e.bg.done, e.bg.wake = true, cancel, make(chan struct{}), make(chan struct{}, 1)
	go e.scanLoop(ctx, e.bg.done, e.bg.wake)
}

func (e *Engine) scanLoop(ctx context.Context, done, wake chan struct{}) {
	defer close(done)
	failures := 0
	for {
		wait, err := e.scanOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			err = e.tablesError(err)
			failures++
			wait = e.cfg.ScanInterval
			if failures == 1 || failures%20 == 0 {
				e.log.WarnContext(ctx, "workflow: the recovery scan failed; it tries again", "error", err, "failures", failures)
			}
		default:
			failures = 0
		}
		// Jitter, so that the engines of a deployment do not all scan at the same instant.
		wait += rand.N(min(200*time.Millisecond, e.cfg.ScanInterval/10) + 1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
			t.Stop()
		case <-t.C:
		}
	}
}

// scanOnce hands expired runs and overdue waits to jobs, starts the runs of due schedule ticks,
// and says how long to sleep: until the next live lease runs out or the next tick is due, at
// most ScanInterval.
func (e *Engine) scanOnce(ctx context.Context) (time.Duration, error) {
	if err := errors.Join(e.scan(ctx), e.scanOverdue(ctx)); err != nil {
		return 0, err
	}
	// The schedules' transaction only when one is due: one statement a pass otherwise.
	tick, ok, err := e.st.ScheduleNextDue(ctx, e.db, e.clockNow())
	if err == nil && ok && tick <= 0 {
		if _, err := e.fireSchedules(ctx); err != nil {
			return 0, err
		}
		tick, ok, err = e.st.ScheduleNextDue(ctx, e.db, e.clockNow())
	}
	if err != nil {
		return 0, err
	}
	wait := e.cfg.ScanInterval
	if ok {
		wait = min(wait, tick)
	}
	next, ok, err := e.st.RunNextExpiry(ctx, e.db)
	if err != nil {
		return 0, err
	}
	if ok {
		wait = min(wait, next)
	}
	return max(wait, minScanWait), nil
}

// Close stops what the engine runs in the background (its recovery scan, its gauge of runs by
// state) and waits for it. It does not close the DB or the River client, and it does not stop
// runs in progress: stop the River client first (river.Client.Stop) so that no job is working a
// run, and let calls of Workflow.Run return. Close is safe to call more than once; an engine is
// not meant to be used after it.
//
//	defer engine.Close()
func (e *Engine) Close() error {
	e.bg.mu.Lock()
	if e.bg.closed {
		e.bg.mu.Unlock()
		return nil
	}
	e.bg.closed = true
	cancel, done, gauge := e.bg.cancel, e.bg.done, e.bg.gauge
	e.bg.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	if gauge != nil {
		return gauge.Unregister()
	}
	return nil
}
