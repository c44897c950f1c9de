package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// scheduleStatements are the texts of the statements on idem_schedules; see the function of
// each.
type scheduleStatements struct {
	now, upsert, get, list, pause, resume, remove, claim, lock, advance, nextDue string
}

// scheduleColumns are what ScheduleRecord holds, read by scanSchedule. The state of the last
// tick's run comes from idem_runs; NULL when it has none (never started, or reaped).
const scheduleColumns = `s.name, s.workflow, s.scope, s.cron, s.every_us, s.time_zone, s.input, s.attributes, s.concurrency_key,
	coalesce(s.concurrency_limit, 0), s.overlap, s.catch_up,
	s.paused, coalesce(s.pause_note, ''), s.next_tick, s.last_tick, coalesce(s.last_run_id, ''), r.state, s.ticks_started,
	s.ticks_skipped, s.created_at, s.updated_at`

const scheduleFrom = `FROM {schedules} s LEFT JOIN {runs} r ON r.scope = s.scope AND r.id = s.last_run_id`

func newScheduleStatements(t Tables) scheduleStatements {
	return scheduleStatements{
		now: t.render(`SELECT coalesce($1::timestamptz, {now})`),

		// A schedule defined again with the same timing keeps its next tick (a deploy that
		// defines it at every start moves nothing); with other timing, it gets the new one's.
		// An operator's pause survives either.
		upsert: t.render(`INSERT INTO {schedules} AS s (name, workflow, scope, cron, every_us, time_zone, input, attributes, overlap,
	catch_up, paused, next_tick, concurrency_key, concurrency_limit, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13, $14, {now}, {now})
ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, scope = excluded.scope, cron = excluded.cron,
	every_us = excluded.every_us, time_zone = excluded.time_zone, input = excluded.input, attributes = excluded.attributes,
	concurrency_key = excluded.concurrency_key, concurrency_limit = excluded.concurrency_limit, overlap = excluded.overlap, catch_up = excluded.catch_up, updated_at = {now},
	next_tick = CASE WHEN (s.cron, s.every_us, s.time_zone) IS NOT DISTINCT FROM (excluded.cron, excluded.every_us, excluded.time_zone)
		THEN s.next_tick ELSE excluded.next_tick END
RETURNING (xmax = 0), next_tick`),

		get: t.render(`SELECT ` + scheduleColumns + ` ` + scheduleFrom + ` WHERE s.name = $1`),

		list: t.render(`SELECT ` + scheduleColumns + ` ` + scheduleFrom + `
WHERE s.name > $1 AND (cardinality($2::text[]) = 0 OR s.workflow = ANY($2::text[]))
ORDER BY s.name LIMIT $3`),

		pause: t.render(`UPDATE {schedules} SET paused = true, pause_note = $2, updated_at = {now} WHERE name = $1`),

		resume: t.render(`UPDATE {schedules} SET paused = false, pause_note = NULL, next_tick = $2, updated_at = {now}
WHERE name = $1 AND paused`),

		remove: t.render(`DELETE FROM {schedules} WHERE name = $1`),

		// One due schedule at a time, each in a transaction of its own that starts its ticks'
		// runs and moves it on: SKIP LOCKED passes over a schedule another engine is firing, so
		// engines share the due schedules and none waits.
		claim: t.render(`WITH due AS (
	SELECT name FROM {schedules} WHERE NOT paused AND next_tick <= coalesce($1::timestamptz, {now}) AND name <> ALL($2::text[])
	ORDER BY next_tick LIMIT 1 FOR UPDATE SKIP LOCKED
)
SELECT ` + scheduleColumns + `, coalesce($1::timestamptz, {now}) ` + scheduleFrom + ` JOIN due d ON d.name = s.name`),

		lock: t.render(`WITH locked AS (
	SELECT name FROM {schedules} WHERE name = $1 FOR UPDATE
)
SELECT ` + scheduleColumns + `, coalesce($2::timestamptz, {now}) ` + scheduleFrom + ` JOIN locked l ON l.name = s.name`),

		advance: t.render(`UPDATE {schedules} SET next_tick = coalesce($2, next_tick),
	last_tick = CASE WHEN $3::timestamptz IS NOT NULL AND (last_tick IS NULL OR $3 >= last_tick) THEN $3 ELSE last_tick END,
	last_run_id = CASE WHEN $3::timestamptz IS NOT NULL AND (last_tick IS NULL OR $3 >= last_tick) THEN $4 ELSE last_run_id END,
	ticks_started = ticks_started + $5, ticks_skipped = ticks_skipped + $6, updated_at = {now}
WHERE name = $1`),

		nextDue: t.render(`SELECT (extract(epoch FROM min(next_tick) - coalesce($1::timestamptz, {now})) * 1000000)::int8
FROM {schedules} WHERE NOT paused`),
	}
}

// ScheduleRecord is a schedule as stored.
type ScheduleRecord struct {
	Name, Workflow, Scope string
	Cron                  *string
	Every                 time.Duration // 0 when Cron is set
	TimeZone              string
	Input                 []byte
	Attributes            map[string]string
	Concurrency           *Concurrency // of the runs it starts; nil for none
	Overlap, CatchUp      string
	Paused                bool
	PauseNote             string
	NextTick              time.Time
	LastTick              *time.Time
	LastRunID             string
	LastRunState          *RunState // nil when the last tick's run is not stored (none, or reaped)
	TicksStarted          int64
	TicksSkipped          int64
	Created, Updated      time.Time
}

func scanSchedule(row pgx.Row, extra ...any) (*ScheduleRecord, error) {
	s := &ScheduleRecord{}
	var every *int64
	var ckey *string
	var climit int
	dest := append([]any{&s.Name, &s.Workflow, &s.Scope, &s.Cron, &every, &s.TimeZone, &s.Input, &s.Attributes, &ckey, &climit,
		&s.Overlap, &s.CatchUp, &s.Paused, &s.PauseNote, &s.NextTick, &s.LastTick, &s.LastRunID, &s.LastRunState, &s.TicksStarted,
		&s.TicksSkipped, &s.Created, &s.Updated}, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	if every != nil {
		s.Every = time.Duration(*every) * time.Microsecond
	}
	if ckey != nil {
		s.Concurrency = &Concurrency{Key: *ckey, Limit: climit}
	}
	return s, nil
}

// ScheduleNow is the time the scheduler goes by: at, when set (a test's clock), else Postgres's.
func (st *Statements) ScheduleNow(ctx context.Context, q Querier, at *time.Time) (now time.Time, err error) {
	err = q.QueryRow(ctx, st.sched.now, at).Scan(&now)
	return now, err
}

// ScheduleUpsertParams define a schedule. Exactly one of Cron and Every is set. NextTick is its
// first tick from now, which a schedule that already exists with the same timing keeps its own
// instead of.
type ScheduleUpsertParams struct {
	Name, Workflow, Scope string
	Cron                  string
	Every                 time.Duration
	TimeZone              string
	Input                 []byte
	Attributes            map[string]string
	Concurrency           *Concurrency // of the runs it starts; nil for none
	Overlap, CatchUp      string
	Paused                bool // for a new schedule only
	NextTick              time.Time
}

// ScheduleUpsert creates a schedule, or redefines the one of that name. created says which;
// next is its next tick afterwards.
func (st *Statements) ScheduleUpsert(ctx context.Context, q Querier, p ScheduleUpsertParams) (created bool, next time.Time, err error) {
	var every any
	if p.Every > 0 {
		every = p.Every.Microseconds()
	}
	ck, cl := p.Concurrency.args()
	err = q.QueryRow(ctx, st.sched.upsert, p.Name, p.Workflow, p.Scope, nullText(p.Cron), every, p.TimeZone, p.Input,
		attributesArg(p.Attributes), p.Overlap, p.CatchUp, p.Paused, p.NextTick, ck, cl).Scan(&created, &next)
	return created, next, err
}

// ScheduleGet reads a schedule. ok is false when there is none.
func (st *Statements) ScheduleGet(ctx context.Context, q Querier, name string) (*ScheduleRecord, bool, error) {
	s, err := scanSchedule(q.QueryRow(ctx, st.sched.get, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return s, err == nil, err
}

// ScheduleList lists up to limit schedules by name, after the name after ("" for the first),
// of any of workflows (all when empty).
func (st *Statements) ScheduleList(ctx context.Context, q Querier, after string, workflows []string, limit int) ([]*ScheduleRecord, error) {
	if workflows == nil {
		workflows = []string{}
	}
	rows, err := q.Query(ctx, st.sched.list, after, workflows, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*ScheduleRecord, error) { return scanSchedule(r) })
}

// SchedulePause pauses a schedule with a note for operators. ok is false when there is none.
func (st *Statements) SchedulePause(ctx context.Context, q Querier, name, note string) (ok bool, err error) {
	tag, err := q.Exec(ctx, st.sched.pause, name, nullText(note))
	return tag.RowsAffected() == 1, err
}

// ScheduleResume unpauses a paused schedule, whose next tick becomes next. ok is false when
// there is no paused schedule of that name.
func (st *Statements) ScheduleResume(ctx context.Context, q Querier, name string, next time.Time) (ok bool, err error) {
	tag, err := q.Exec(ctx, st.sched.resume, name, next)
	return tag.RowsAffected() == 1, err
}

// ScheduleDelete deletes a schedule; the runs it started stay. ok is false when there was none.
func (st *Statements) ScheduleDelete(ctx context.Context, q Querier, name string) (ok bool, err error) {
	tag, err := q.Exec(ctx, st.sched.remove, name)
	return tag.RowsAffected() == 1, err
}

// ScheduleClaim takes one active schedule whose next tick is due at now (nil: Postgres's now),
// but for those named in except, locking it for the rest of the caller's transaction, and
// passing over schedules that other transactions hold (SKIP LOCKED). It returns the time it went
// by; ok is false when none is due, or every due one is held.
func (st *Statements) ScheduleClaim(ctx context.Context, q Querier, now *time.Time, except []string) (s *ScheduleRecord, at time.Time, ok bool, err error) {
	if except == nil {
		except = []string{}
	}
	s, err = scanSchedule(q.QueryRow(ctx, st.sched.claim, now, except), &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, at, false, nil
	}
	return s, at, err == nil, err
}

// ScheduleLock reads a schedule and locks it for the rest of the caller's transaction, waiting
// for a scheduler that holds it, with the time it went by (now, or Postgres's). ok is false when
// there is none.
func (st *Statements) ScheduleLock(ctx context.Context, q Querier, name string, now *time.Time) (s *ScheduleRecord, at time.Time, ok bool, err error) {
	s, err = scanSchedule(q.QueryRow(ctx, st.sched.lock, name, now), &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, at, false, nil
	}
	return s, at, err == nil, err
}

// ScheduleAdvanceParams record what a firing did: the schedule's next tick (nil: unchanged),
// the latest tick it started a run for and that run's key ID (nil: none; an older tick than the
// last one recorded leaves that one), and how many ticks it started and skipped.
type ScheduleAdvanceParams struct {
	Name             string
	NextTick         *time.Time
	LastTick         *time.Time
	LastRunID        string
	Started, Skipped int
}

// ScheduleAdvance records a firing, in the transaction that claimed or locked the schedule.
func (st *Statements) ScheduleAdvance(ctx context.Context, q Querier, p ScheduleAdvanceParams) error {
	_, err := q.Exec(ctx, st.sched.advance, p.Name, p.NextTick, p.LastTick, nullText(p.LastRunID), p.Started, p.Skipped)
	return err
}

// ScheduleNextDue says how long until the earliest next tick of an active schedule, from now
// (nil: Postgres's now); negative when one is due. ok is false when no schedule is active.
func (st *Statements) ScheduleNextDue(ctx context.Context, q Querier, now *time.Time) (d time.Duration, ok bool, err error) {
	var us *int64
	if err := q.QueryRow(ctx, st.sched.nextDue, now).Scan(&us); err != nil {
		return 0, false, err
	}
	if us == nil {
		return 0, false, nil
	}
	return time.Duration(*us) * time.Microsecond, true, nil
}
