package workflow

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/internal/store"
)

// Schedules are fired by the same loop that scans for expired leases (recovery.go), in every
// engine whose workers run, not by River's leader: each due schedule is taken in a transaction of
// its own with FOR UPDATE SKIP LOCKED, its due ticks' runs are started in that transaction
// (ownerless, as StartTx starts them, with their resume jobs) and its next tick moved on, so a
// tick and its run commit together, and engines share the due schedules without waiting for
// each other. Between passes the loop sleeps until the earliest next tick (at most
// ScanInterval); defining, resuming or triggering a schedule wakes this engine's loop at once.

// Bounds of one firing: the ticks one schedule starts in one transaction (CatchUpAll goes on in
// the next), the schedules one pass fires, and how far the walk over missed ticks goes before it
// jumps to the latest (a schedule every second, down for a month).
const (
	maxTicksPerFiring   = 100
	maxFiringsPerPass   = 100
	maxTickWalk         = 100_000
	maxBackfillTicks    = 1000
	scheduleLookbackMin = time.Minute
)

// clockNow is the time the schedules go by: nil for Postgres's now(), or the test's clock.
func (e *Engine) clockNow() *time.Time {
	if f := e.schedClock.Load(); f != nil {
		t := (*f)()
		return &t
	}
	return nil
}

// poke wakes the engine's loop, so that a schedule defined, resumed or triggered here is seen
// before the loop's sleep runs out.
func (e *Engine) poke() {
	e.bg.mu.Lock()
	wake := e.bg.wake
	e.bg.mu.Unlock()
	if wake != nil {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// fireSchedules starts the runs of every due tick, one schedule per transaction, until none is
// due (at most maxFiringsPerPass schedules; the loop comes back at once for the rest), and says
// how many schedules it fired.
func (e *Engine) fireSchedules(ctx context.Context) (fired int, err error) {
	jobs, err := e.jobs(ctx)
	if err != nil {
		return 0, err
	}
	// A schedule that fails to fire is passed over for the rest of the pass, so that it does not
	// hold up the ones due after it; it is tried again at the next pass.
	var failed []string
	var errs []error
	for range maxFiringsPerPass {
		name, err := e.fireOne(ctx, jobs, failed)
		switch {
		case err != nil && name == "":
			return fired, errors.Join(append(errs, err)...)
		case err != nil:
			failed, errs = append(failed, name), append(errs, err)
		case name == "":
			return fired, errors.Join(errs...)
		default:
			fired++
		}
	}
	return fired, errors.Join(errs...)
}

// fireOne fires one due schedule but for those named in except, and returns its name: "" when
// none is due (or every due one is being fired by another engine).
func (e *Engine) fireOne(ctx context.Context, jobs jobInserter, except []string) (name string, err error) {
	err = pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error {
		s, now, ok, err := e.st.ScheduleClaim(ctx, t, e.clockNow(), except)
		switch {
		case err != nil:
			return fmt.Errorf("workflow: error looking for due schedules: %w", e.tablesError(err))
		case !ok:
			return nil
		}
		name = s.Name
		tm, err := timingOf(s)
		if err != nil {
			return e.pauseBroken(ctx, t, s.Name, err)
		}
		start, skipped, next := planTicks(tm, s.NextTick, now, CatchUpPolicy(s.CatchUp))
		if next.IsZero() {
			return e.pauseBroken(ctx, t, s.Name, errors.New("its cron expression has no tick in the next five years"))
		}
		adv := store.ScheduleAdvanceParams{Name: s.Name, NextTick: &next, Skipped: skipped}
		busy := s.LastRunState != nil && !s.LastRunState.Finished()
		for _, tick := range start {
			if busy && s.Overlap == string(OverlapSkip) {
				adv.Skipped++
				unfinished := e.keys.Log(redact.Key{Scope: s.Scope, ID: s.LastRunID})
				unfinished.Key = "unfinished_" + unfinished.Key
				e.log.DebugContext(ctx, "workflow: schedule tick skipped: the run before it is unfinished", "schedule", s.Name, "tick", tick,
					unfinished)
				continue
			}
			key, started, err := e.startTick(ctx, jobs, t, s, tick)
			if err != nil {
				return err
			}
			if started {
				adv.Started++
				adv.LastTick, adv.LastRunID, busy = &tick, key.ID, true
			}
		}
		if err := e.st.ScheduleAdvance(ctx, t, adv); err != nil {
			return fmt.Errorf("workflow: error moving schedule %q on: %w", s.Name, err)
		}
		return nil
	})
	if err != nil && name != "" {
		err = fmt.Errorf("workflow: error firing schedule %q: %w", name, err)
	}
	return name, err
}

// pauseBroken pauses a schedule whose stored timing this process cannot follow (a time zone it
// does not know, an expression edited by hand), with the reason as its note: it would otherwise
// be due on every pass, and an operator sees the note in `idem schedules list`.
func (e *Engine) pauseBroken(ctx context.Context, t pgx.Tx, name string, why error) error {
	note := "paused by the scheduler: " + why.Error()
	e.log.WarnContext(ctx, "workflow: schedule paused: its timing cannot be followed", "schedule", name, "error", why)
	if _, err := e.st.SchedulePause(ctx, t, name, note); err != nil {
		return fmt.Errorf("workflow: error pausing schedule %q: %w", name, err)
	}
	return nil
}

// startTick starts the run of one tick in t, ownerless. started is false when its key holds a
// run already (a backfill, a trigger, or another workflow's or Do's key, which is logged).
func (e *Engine) startTick(ctx context.Context, jobs jobInserter, t pgx.Tx, s *store.ScheduleRecord, tick time.Time) (idem.Key, bool, error) {
	key := tickKey(s.Scope, s.Name, tick)
	attrs := make(map[string]string, len(s.Attributes)+1)
	maps.Copy(attrs, s.Attributes)
	attrs[ScheduleAttribute] = s.Name
	started, err := e.startOwnerless(ctx, jobs, t, store.RunEnqueueParams{Scope: key.Scope, ID: key.ID, Workflow: s.Workflow, Input: s.Input,
		Fingerprint: idem.Fingerprint("idem.workflow.input", s.Workflow, string(s.Input)), Attributes: attrs, Concurrency: s.Concurrency,
		Version: e.cfg.Version},
		resumeScheduled)
	switch {
	case errors.Is(err, idem.ErrMismatch):
		// The tick's key was taken by something else: the tick has had its chance.
		e.log.WarnContext(ctx, "workflow: schedule tick not started: its key is taken", "schedule", s.Name, "tick", tick, "scope", key.Scope,
			e.keys.Log(rkey(key)), e.keys.Error(err, rkey(key)))
		return key, false, nil
	case err != nil:
		return key, false, err
	}
	if started {
		e.log.DebugContext(ctx, "workflow: schedule tick started a run", "schedule", s.Name, "tick", tick, "scope", key.Scope, e.keys.Log(rkey(key)))
	}
	return key, started, nil
}

// timing is the stored schedule's timing.
func timingOf(s *store.ScheduleRecord) (timing, error) {
	spec := ""
	if s.Cron != nil {
		spec = *s.Cron
	}
	return parseTiming("", spec, s.Every, s.TimeZone)
}

// planTicks says which due ticks, from first (due: at or before now), a firing starts under
// policy, how many it skips, and the schedule's next tick afterwards (zero when the timing has
// none). With CatchUpAll it starts at most maxTicksPerFiring, and the next tick is the first it
// left, due still, for the next firing.
func planTicks(tm timing, first, now time.Time, policy CatchUpPolicy) (start []time.Time, skipped int, next time.Time) {
	var last time.Time
	t := first
	for walked := 0; !t.IsZero() && !t.After(now); walked++ {
		if policy == CatchUpAll {
			if len(start) == maxTicksPerFiring {
				return start, 0, t
			}
			start = append(start, t)
		} else {
			if !last.IsZero() {
				skipped++
			}
			last = t
		}
		if walked == maxTickWalk {
			// Far behind: jump to the latest due tick (the ones between are skipped uncounted).
			if latest, ok := latestTick(tm, t, now); ok {
				last = latest
			}
			t = tm.next(last)
			break
		}
		t = tm.next(t)
	}
	switch {
	case policy == CatchUpAll, last.IsZero():
	case policy == CatchUpSkip && now.Sub(last) > ScheduleGrace:
		skipped++
	default:
		start = []time.Time{last}
	}
	return start, skipped, t
}

// latestTick finds the latest tick in (after, now], searching back from now over windows that
// grow fourfold, so that it walks few ticks whatever the timing.
func latestTick(tm timing, after, now time.Time) (time.Time, bool) {
	for w := scheduleLookbackMin; ; w *= 4 {
		from := now.Add(-w)
		if !from.After(after) {
			from = after
		}
		t := tm.next(from)
		if !t.IsZero() && !t.After(now) {
			for {
				n := tm.next(t)
				if n.IsZero() || n.After(now) {
					return t, true
				}
				t = n
			}
		}
		if from.Equal(after) {
			return time.Time{}, false
		}
	}
}
