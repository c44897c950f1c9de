package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

// The operator's side of schedules: reading, pausing, resuming, deleting, triggering and
// backfilling them. None needs the schedule's workflow registered with the engine, so cmd/idem
// offers them all; triggering and backfilling start runs, and so need the engine's River client.

// ScheduleRow is a schedule as stored, for operators: what [Engine.ScheduleGet] and
// [Engine.ScheduleList] return.
//
//	s, err := engine.ScheduleGet(ctx, "nightly-settlement")
//	fmt.Printf("%s: next %s, %d started, %d skipped\n", s.Name, s.NextTick, s.TicksStarted, s.TicksSkipped)
type ScheduleRow struct {
	Name     string `json:"name"`
	Workflow string `json:"workflow"`
	Scope    string `json:"scope"` // of its runs' keys

	// Cron or Every, as defined, and the time zone of Cron.
	Cron     string        `json:"cron,omitempty"`
	Every    time.Duration `json:"every,omitempty"`
	TimeZone string        `json:"time_zone"`

	// ConcurrencyKey is its runs' concurrency key (Workflow.WithConcurrency), from its input; ""
	// for none.
	ConcurrencyKey string `json:"concurrency_key,omitempty"`

	Overlap    OverlapPolicy     `json:"overlap"`
	CatchUp    CatchUpPolicy     `json:"catch_up"`
	Input      json.RawMessage   `json:"input,omitempty"`
	Attributes map[string]string `json:"attributes,omitempty"`

	// Paused schedules start no ticks; PauseNote says why, as the operator (or the scheduler,
	// for a schedule whose timing it cannot follow) gave it.
	Paused    bool   `json:"paused"`
	PauseNote string `json:"pause_note,omitempty"`

	// NextTick is the next tick to start; the ones before it were started or skipped.
	NextTick time.Time `json:"next_tick"`

	// LastTick is the latest tick a run was started for, LastRun that run's key and
	// LastRunState its state ("" when it is no longer stored: reaped).
	LastTick     *time.Time `json:"last_tick,omitempty"`
	LastRun      *idem.Key  `json:"last_run,omitempty"`
	LastRunState RunState   `json:"last_run_state,omitempty"`

	// TicksStarted and TicksSkipped count the ticks that started a run, and those skipped by
	// the overlap or catch-up policy (missed ticks passed over after a long downtime may go
	// uncounted).
	TicksStarted int64 `json:"ticks_started"`
	TicksSkipped int64 `json:"ticks_skipped"`

	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
}

func scheduleRow(s *store.ScheduleRecord) *ScheduleRow {
	row := &ScheduleRow{Name: s.Name, Workflow: s.Workflow, Scope: s.Scope, Every: s.Every, TimeZone: s.TimeZone,
		Overlap: OverlapPolicy(s.Overlap), CatchUp: CatchUpPolicy(s.CatchUp), Input: rawJSON(s.Input), Attributes: s.Attributes,
		Paused: s.Paused, PauseNote: s.PauseNote, NextTick: s.NextTick, LastTick: s.LastTick, TicksStarted: s.TicksStarted,
		TicksSkipped: s.TicksSkipped, Created: s.Created, Updated: s.Updated}
	if s.Cron != nil {
		row.Cron = *s.Cron
	}
	if s.Concurrency != nil {
		row.ConcurrencyKey = s.Concurrency.Key
	}
	if s.LastRunID != "" {
		row.LastRun = &idem.Key{Scope: s.Scope, ID: s.LastRunID}
	}
	if s.LastRunState != nil {
		row.LastRunState = RunState(*s.LastRunState)
	}
	return row
}

func scheduleNotFound(name string) error {
	return fmt.Errorf("%w: no schedule is named %q", idem.ErrNotFound, name)
}

// ScheduleGet reads the schedule name. None of that name is idem.ErrNotFound.
//
//	s, err := engine.ScheduleGet(ctx, "nightly-settlement")
//	if errors.Is(err, idem.ErrNotFound) { ... }
func (e *Engine) ScheduleGet(ctx context.Context, name string) (*ScheduleRow, error) {
	if err := validScheduleName(name); err != nil {
		return nil, err
	}
	s, ok, err := e.st.ScheduleGet(ctx, e.db, name)
	switch {
	case err != nil:
		return nil, fmt.Errorf("workflow: error reading schedule: %w", e.tablesError(err))
	case !ok:
		return nil, scheduleNotFound(name)
	}
	return scheduleRow(s), nil
}

// ScheduleListParams filter and page [Engine.ScheduleList]. nil selects the first page of all.
//
//	params := &workflow.ScheduleListParams{Workflows: []string{"settle"}}
type ScheduleListParams struct {
	Workflows []string // schedules of any of these workflows; all when empty
	After     string   // the name of the last schedule of the page before (ScheduleListResult.Next)
	Limit     int      // page size: default 100, at most 1000
}

// ScheduleListResult is a page of schedules, by name.
//
//	res, err := engine.ScheduleList(ctx, nil)
//	for _, s := range res.Schedules { fmt.Println(s.Name, s.NextTick) }
type ScheduleListResult struct {
	Schedules []*ScheduleRow `json:"schedules"`
	// Next is the After of the next page, "" when this page is the last.
	Next string `json:"next,omitempty"`
}

// ScheduleList lists schedules by name, without side effects.
//
//	res, err := engine.ScheduleList(ctx, &workflow.ScheduleListParams{Workflows: []string{"settle"}})
func (e *Engine) ScheduleList(ctx context.Context, params *ScheduleListParams) (*ScheduleListResult, error) {
	if params == nil {
		params = &ScheduleListParams{}
	}
	limit, err := pageLimit("ScheduleListParams.Limit", params.Limit)
	if err != nil {
		return nil, err
	}
	if params.After != "" {
		if err := validScheduleName(params.After); err != nil {
			return nil, fmt.Errorf("workflow: ScheduleListParams.After is not a schedule's name: %w", err)
		}
	}
	records, err := e.st.ScheduleList(ctx, e.db, params.After, params.Workflows, limit+1)
	if err != nil {
		return nil, fmt.Errorf("workflow: error listing schedules: %w", e.tablesError(err))
	}
	res := &ScheduleListResult{Schedules: make([]*ScheduleRow, 0, len(records))}
	for _, s := range records {
		res.Schedules = append(res.Schedules, scheduleRow(s))
	}
	if len(res.Schedules) > limit {
		res.Schedules = res.Schedules[:limit]
		res.Next = res.Schedules[limit-1].Name
	}
	return res, nil
}

// SchedulePause pauses the schedule name: it starts no ticks until [Engine.ScheduleResume].
// note says why, for other operators ("" for none). Pausing a paused schedule replaces its note.
// Runs it started go on. None of that name is idem.ErrNotFound.
//
//	err := engine.SchedulePause(ctx, "nightly-settlement", "bank holiday, INC-4711")
func (e *Engine) SchedulePause(ctx context.Context, name, note string) error {
	if err := validScheduleName(name); err != nil {
		return err
	}
	ok, err := e.st.SchedulePause(ctx, e.db, name, note)
	switch {
	case err != nil:
		return fmt.Errorf("workflow: error pausing schedule: %w", e.tablesError(err))
	case !ok:
		return scheduleNotFound(name)
	}
	return nil
}

// ScheduleResume resumes the paused schedule name. Ticks that passed while it was paused are not
// started (trigger or backfill them for that): it goes on from its first tick after now.
// Resuming a schedule that is not paused does nothing. None of that name is idem.ErrNotFound.
//
//	err := engine.ScheduleResume(ctx, "nightly-settlement")
func (e *Engine) ScheduleResume(ctx context.Context, name string) error {
	if err := validScheduleName(name); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error {
		s, now, tm, err := e.lockSchedule(ctx, t, name)
		if err != nil || !s.Paused {
			return err
		}
		next := tm.next(now)
		if next.IsZero() {
			return fmt.Errorf("workflow: schedule %q has no tick in the next five years; define it again with other timing", name)
		}
		if _, err := e.st.ScheduleResume(ctx, t, name, next); err != nil {
			return fmt.Errorf("workflow: error resuming schedule: %w", err)
		}
		return nil
	})
	if err == nil {
		e.poke()
	}
	return err
}

// ScheduleDelete deletes the schedule name. The runs it started stay, and finish. None of that
// name is idem.ErrNotFound.
//
//	err := engine.ScheduleDelete(ctx, "nightly-settlement")
func (e *Engine) ScheduleDelete(ctx context.Context, name string) error {
	if err := validScheduleName(name); err != nil {
		return err
	}
	ok, err := e.st.ScheduleDelete(ctx, e.db, name)
	switch {
	case err != nil:
		return fmt.Errorf("workflow: error deleting schedule: %w", e.tablesError(err))
	case !ok:
		return scheduleNotFound(name)
	}
	return nil
}

// lockSchedule locks the schedule name for the rest of t, and reads it, the time and its timing.
func (e *Engine) lockSchedule(ctx context.Context, t pgx.Tx, name string) (*store.ScheduleRecord, time.Time, timing, error) {
	s, now, ok, err := e.st.ScheduleLock(ctx, t, name, e.clockNow())
	switch {
	case err != nil:
		return nil, now, nil, fmt.Errorf("workflow: error reading schedule: %w", e.tablesError(err))
	case !ok:
		return nil, now, nil, scheduleNotFound(name)
	}
	tm, err := timingOf(s)
	if err != nil {
		return nil, now, nil, fmt.Errorf("workflow: schedule %q cannot be followed here: %w", name, err)
	}
	return s, now, tm, nil
}

// ScheduleTrigger starts a run of the schedule name now, whatever its next tick, pause or
// overlap policy say: its key is the schedule's for a tick at the current time (Postgres's, to
// the microsecond). It returns the run's key. It needs the engine's River client.
//
//	key, err := engine.ScheduleTrigger(ctx, "nightly-settlement")
//	run, err := engine.RunGet(ctx, key)
func (e *Engine) ScheduleTrigger(ctx context.Context, name string) (idem.Key, error) {
	if err := validScheduleName(name); err != nil {
		return idem.Key{}, err
	}
	jobs, err := e.jobs(ctx)
	if err != nil {
		return idem.Key{}, err
	}
	var key idem.Key
	err = pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error {
		s, now, _, err := e.lockSchedule(ctx, t, name)
		if err != nil {
			return err
		}
		k, started, err := e.startTick(ctx, jobs, t, s, now)
		if err != nil {
			return err
		}
		if !started {
			return fmt.Errorf("workflow: the key %q in scope %q of this instant is taken already; trigger again", k.ID, k.Scope)
		}
		key = k
		return e.st.ScheduleAdvance(ctx, t, store.ScheduleAdvanceParams{Name: name, LastTick: &now, LastRunID: k.ID, Started: 1})
	})
	return key, err
}

// ScheduleBackfillResult says what [Engine.ScheduleBackfill] did.
//
//	fmt.Printf("started %d, %d had run already\n", len(res.Started), res.Existing)
type ScheduleBackfillResult struct {
	Started  []idem.Key `json:"started"`  // the keys of the runs it started, oldest tick first
	Existing int        `json:"existing"` // ticks whose key held a run already, left alone
}

// ScheduleBackfill starts a run for each tick of the schedule name at or after from and before
// to, whatever its pause or overlap policy say, under each tick's own key: a tick that ran
// already (its key holds a run) is left alone, so a backfill can be repeated. to cannot be after
// now (the ticks to come are the schedule's); a zero to means now, by Postgres's clock. The range
// may hold at most 1000 ticks. It needs the engine's River client.
//
//	res, err := engine.ScheduleBackfill(ctx, "nightly-settlement", time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC))
func (e *Engine) ScheduleBackfill(ctx context.Context, name string, from, to time.Time) (*ScheduleBackfillResult, error) {
	if err := validScheduleName(name); err != nil {
		return nil, err
	}
	if !to.IsZero() && !from.Before(to) {
		return nil, fmt.Errorf("workflow: a backfill's from (%s) must be before its to (%s)", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	jobs, err := e.jobs(ctx)
	if err != nil {
		return nil, err
	}
	res := &ScheduleBackfillResult{Started: []idem.Key{}}
	err = pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error {
		s, now, tm, err := e.lockSchedule(ctx, t, name)
		if err != nil {
			return err
		}
		if to.IsZero() {
			to = now
		}
		if !from.Before(to) {
			return fmt.Errorf("workflow: a backfill's from (%s) must be before now (%s)", from.Format(time.RFC3339), now.Format(time.RFC3339))
		}
		if to.After(now) {
			return fmt.Errorf("workflow: a backfill's to (%s) cannot be after now (%s): the ticks to come are the schedule's", to.Format(time.RFC3339), now.Format(time.RFC3339))
		}
		var ticks []time.Time
		for tick := tm.next(from.Add(-time.Microsecond)); !tick.IsZero() && tick.Before(to); tick = tm.next(tick) {
			if len(ticks) == maxBackfillTicks {
				return fmt.Errorf("workflow: the backfill from %s to %s holds more than %d ticks; backfill a shorter range at a time", from.Format(time.RFC3339), to.Format(time.RFC3339), maxBackfillTicks)
			}
			ticks = append(ticks, tick)
		}
		adv := store.ScheduleAdvanceParams{Name: name}
		for _, tick := range ticks {
			key, started, err := e.startTick(ctx, jobs, t, s, tick)
			if err != nil {
				return err
			}
			if !started {
				res.Existing++
				continue
			}
			res.Started = append(res.Started, key)
			adv.Started++
			adv.LastTick, adv.LastRunID = &tick, key.ID
		}
		return e.st.ScheduleAdvance(ctx, t, adv)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}
