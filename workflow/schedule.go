package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/robfig/cron/v3"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

// OverlapPolicy says what a schedule's tick does while the run of the tick before it is still
// unfinished (running, or waiting).
//
//	opts := &workflow.ScheduleOpts{Cron: "*/5 * * * *", Overlap: workflow.OverlapAllow}
type OverlapPolicy string

// The overlap policies. OverlapSkip, the default, skips the tick (counted in
// ScheduleRow.TicksSkipped); OverlapAllow starts its run beside the one before.
//
//	if row.Overlap == workflow.OverlapSkip { ... }
const (
	OverlapSkip  OverlapPolicy = "skip"
	OverlapAllow OverlapPolicy = "allow"
)

// CatchUpPolicy says which of a schedule's ticks that passed while no engine could start them
// (every process was down, the database was unreachable) are started afterwards.
//
//	opts := &workflow.ScheduleOpts{Cron: "0 2 * * *", CatchUp: workflow.CatchUpAll}
type CatchUpPolicy string

// The catch-up policies:
//
//   - CatchUpLatest, the default: the latest missed tick starts its run; the ones before it are
//     skipped. What a job that brings something up to date wants (a sync, a report of "now").
//
//   - CatchUpAll: every missed tick starts its run, oldest first. What a job per period wants
//     (a nightly settlement for each night). The overlap policy still applies: with OverlapSkip,
//     ticks whose predecessor is unfinished are skipped, so use OverlapAllow to run them all.
//
//   - CatchUpSkip: missed ticks are skipped, and the schedule goes on from its next tick. A tick
//     is missed when it is more than ScheduleGrace late.
//
// For example:
//
//	if row.CatchUp == workflow.CatchUpAll { ... }
const (
	CatchUpLatest CatchUpPolicy = "latest"
	CatchUpAll    CatchUpPolicy = "all"
	CatchUpSkip   CatchUpPolicy = "skip"
)

// ScheduleGrace is how late a tick may start and still not count as missed (CatchUpSkip). The
// engines start a tick moments after it is due; this covers a slow database or a busy process.
//
//	late := now.Sub(tick) > workflow.ScheduleGrace
const ScheduleGrace = time.Minute

// DefaultScheduleScope is the scope of the keys of a schedule's runs when ScheduleOpts.Scope is
// empty.
//
//	key := idem.Key{Scope: workflow.DefaultScheduleScope, ID: "sched/nightly/2026-01-02T02:00:00Z"}
const DefaultScheduleScope = "idem.schedule"

// ScheduleAttribute is the attribute every run a schedule starts has, with the schedule's name
// as its value: `idem runs list --attr idem.schedule=NAME` lists them.
//
//	res, err := engine.RunList(ctx, &workflow.RunListParams{Attributes: map[string]string{workflow.ScheduleAttribute: "nightly"}})
const ScheduleAttribute = "idem.schedule"

// maxScheduleName bounds a schedule's name, so that the key of a tick's run
// ("sched/<name>/<tick>") fits in idem.MaxKeyLength.
const maxScheduleName = 200

// ScheduleOpts define a schedule: when it ticks (Cron or Every, exactly one), in which time
// zone, and what it does about overlapping runs and missed ticks.
//
//	opts := &workflow.ScheduleOpts{
//		Cron:     "0 2 * * *", // 02:00 every day
//		TimeZone: "Europe/Berlin",
//		CatchUp:  workflow.CatchUpAll,
//	}
type ScheduleOpts struct {
	// Cron is a cron expression: five fields (minute hour day-of-month month day-of-week), or
	// six with seconds first, or a descriptor (@hourly, @daily, @weekly, @monthly, @yearly), as
	// github.com/robfig/cron/v3 parses them. Its times are in TimeZone. An expression that
	// names its hours ("0 2 * * *") ticks at each of its times once a day, on the days the clocks
	// change too: at the first pass of a time the clocks go back over, and as late as the jump
	// for a time they jump over (03:00 for 02:00 in a jump from 02:00 to 03:00). One that ticks
	// every hour ("0 * * * *") ticks every hour of elapsed time through both.
	Cron string

	// Every makes the schedule tick at whole multiples of it since the Unix epoch (Every: time.Hour
	// ticks on the hour, UTC), instead of Cron. A whole number of seconds, at least one.
	Every time.Duration

	// TimeZone is the IANA name of the zone Cron is read in, such as "Europe/Berlin"; default
	// "UTC". The process must know it (an operating system's zoneinfo, or import time/tzdata).
	// Every has no zone: a TimeZone other than "UTC" with it is refused.
	TimeZone string

	// Scope is the scope of the keys of the runs the schedule starts; default
	// DefaultScheduleScope. A tick's key is "sched/<name>/<tick>" in it, with the tick in UTC,
	// RFC 3339.
	Scope string

	// Overlap is what a tick does while the run before it is unfinished; default OverlapSkip.
	Overlap OverlapPolicy

	// CatchUp is which missed ticks start runs afterwards; default CatchUpLatest.
	CatchUp CatchUpPolicy

	// Attributes are given to every run the schedule starts, with ScheduleAttribute (which
	// they cannot set).
	Attributes map[string]string

	// Paused creates the schedule paused (Engine.ScheduleResume starts it). It applies only to
	// a schedule that does not exist yet: an existing one keeps its state.
	Paused bool
}

// timing is when a schedule ticks: next returns its first tick strictly after t, in UTC, or the zero time
// when it has none (a cron expression such as "0 0 30 2 *" never matches).
type timing interface {
	next(t time.Time) time.Time
}

// cronTiming is a cron expression in a time zone. An expression that ticks in every hour of the
// day ("0 * * * *", "*/5 * * * *") goes by elapsed time: it ticks in both passes of an hour the
// clocks go back over, and loses no tick when they jump forward. Any other ("0 2 * * *") goes by
// the wall clock, each of its times once a day: a time the clocks go back over ticks at its first
// pass only, and a time they jump over ticks as much later as the jump (02:30 in a jump from
// 02:00 to 03:00 ticks at 03:30), so that a daily run is neither doubled nor lost on the days the
// clocks change.
type cronTiming struct {
	sched cron.Schedule
	loc   *time.Location
	wall  bool
}

func newCronTiming(sched cron.Schedule, loc *time.Location) cronTiming {
	const allHours = 1<<24 - 1
	spec, ok := sched.(*cron.SpecSchedule)
	return cronTiming{sched: sched, loc: loc, wall: ok && spec.Hour&allHours != allHours}
}

func (c cronTiming) next(t time.Time) time.Time {
	if !c.wall {
		return c.sched.Next(t.In(c.loc)).UTC()
	}
	// Walk the wall clock's times as if they were UTC's (which has no jumps), and take the first
	// whose instant is after t: a time the clocks jumped over, or a second pass, maps to an
	// instant at or before one already taken.
	l := t.In(c.loc)
	w := time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
	for range 1000 {
		w = c.sched.Next(w)
		if w.IsZero() {
			return w
		}
		if at := wallInstant(w, c.loc); at.After(t) {
			return at.UTC()
		}
	}
	return time.Time{}
}

// wallInstant is the instant at which loc's clocks show w's date and time (read as UTC's): the
// first of two when the clocks go back over it, and as much after it as the jump when they jump
// over it.
func wallInstant(w time.Time, loc *time.Location) time.Time {
	_, before := w.Add(-36 * time.Hour).In(loc).Zone()
	_, after := w.Add(36 * time.Hour).In(loc).Zone()
	var first time.Time
	for _, off := range []int{before, after} {
		at := w.Add(-time.Duration(off) * time.Second)
		l := at.In(loc)
		same := time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC).Equal(w)
		if same && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	if first.IsZero() {
		return w.Add(-time.Duration(before) * time.Second)
	}
	return first
}

type everyTiming struct{ us int64 }

func (e everyTiming) next(t time.Time) time.Time {
	us := t.UnixMicro()
	n := us / e.us
	if us < 0 && us%e.us != 0 {
		n-- // floor, for times before the epoch
	}
	return time.UnixMicro((n + 1) * e.us).UTC()
}

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseTiming makes the timing of a schedule, and says what is wrong with it, naming the field
// (prefix is "ScheduleOpts." for a definition).
func parseTiming(prefix, spec string, every time.Duration, zone string) (timing, error) {
	switch {
	case spec == "" && every == 0:
		return nil, fmt.Errorf("workflow: %sCron or %sEvery must be set: when should the schedule tick?", prefix, prefix)
	case spec != "" && every != 0:
		return nil, fmt.Errorf("workflow: %sCron and %sEvery cannot both be set (got %q and %s)", prefix, prefix, spec, every)
	case every < 0 || (every > 0 && (every < time.Second || every%time.Second != 0)):
		return nil, fmt.Errorf("workflow: %sEvery must be a whole number of seconds, at least one (got %s)", prefix, every)
	case every > 0:
		return everyTiming{us: every.Microseconds()}, nil
	}
	upper := strings.ToUpper(strings.TrimSpace(spec))
	switch {
	case strings.HasPrefix(upper, "TZ=") || strings.HasPrefix(upper, "CRON_TZ="):
		return nil, fmt.Errorf("workflow: %sCron %q names a time zone; set %sTimeZone instead", prefix, spec, prefix)
	case strings.HasPrefix(upper, "@EVERY"):
		return nil, fmt.Errorf("workflow: %sCron %q is an interval; set %sEvery instead, whose ticks do not drift", prefix, spec, prefix)
	}
	loc, err := loadZone(prefix, zone)
	if err != nil {
		return nil, err
	}
	sched, err := cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("workflow: %sCron %q is not a cron expression (minute hour day-of-month month day-of-week, such as \"0 2 * * *\"): %w", prefix, spec, err)
	}
	return newCronTiming(sched, loc), nil
}

func loadZone(prefix, zone string) (*time.Location, error) {
	if zone == "" {
		return time.UTC, nil
	}
	if zone == "Local" {
		return nil, fmt.Errorf("workflow: %sTimeZone %q depends on the machine; name the zone (such as \"Europe/Berlin\")", prefix, zone)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("workflow: %sTimeZone %q is not a time zone this process knows (an IANA name such as \"Europe/Berlin\"; import time/tzdata where the system has no zoneinfo): %w", prefix, zone, err)
	}
	return loc, nil
}

// validScheduleName checks a schedule's name: 1 to 200 bytes of printable ASCII, as a key's ID.
func validScheduleName(name string) error {
	if name == "" || len(name) > maxScheduleName {
		return fmt.Errorf("workflow: a schedule's name must be 1 to %d bytes (got %d)", maxScheduleName, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("workflow: schedule name %q has byte 0x%02x at offset %d; only printable ASCII (0x21-0x7E, no spaces) is allowed", name, c, i)
		}
	}
	return nil
}

// tickKey is the key of the run a schedule starts for tick.
func tickKey(scope, name string, tick time.Time) idem.Key {
	return idem.Key{Scope: scope, ID: "sched/" + name + "/" + tick.UTC().Format(time.RFC3339Nano)}
}

// Schedule creates the schedule name, which starts a run of w with input in at each of its
// ticks, or redefines it: a deployment can define its schedules at every start. A schedule
// defined again with the same timing (Cron or Every, and TimeZone) keeps its next tick; with
// other timing it goes on from the first tick of the new one after now. An operator's pause
// survives a redefinition. w must be registered with e; name is 1 to 200 bytes of printable
// ASCII. The engines whose workers run (AddWorkers, SetClient) start the ticks; see
// [Engine.ScheduleList] and `idem schedules` for operating them.
//
//	err := Settle.Schedule(ctx, engine, "nightly-settlement", SettleReq{}, &workflow.ScheduleOpts{
//		Cron:     "0 2 * * *",
//		TimeZone: "Europe/Berlin",
//		CatchUp:  workflow.CatchUpAll,
//		Overlap:  workflow.OverlapAllow,
//	})
func (w *Workflow[In, Out]) Schedule(ctx context.Context, e *Engine, name string, in In, opts *ScheduleOpts) error {
	if e == nil {
		return errors.New("workflow: Schedule needs an engine; e is nil")
	}
	if err := pgx.BeginFunc(ctx, e.db, func(t pgx.Tx) error { return w.ScheduleTx(ctx, e, t, name, in, opts) }); err != nil {
		return err
	}
	e.poke() // this engine's loop sees the new timing now; the others at their next pass
	return nil
}

// ScheduleTx is [Workflow.Schedule] in the caller's transaction t: the schedule exists, or
// changes, if and only if t commits. The engines' loops see it at their next pass (at most
// Config.ScanInterval later).
//
//	err := pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error {
//		return Report.ScheduleTx(ctx, engine, t, "report:"+tenant, ReportReq{Tenant: tenant}, &workflow.ScheduleOpts{Every: time.Hour})
//	})
func (w *Workflow[In, Out]) ScheduleTx(ctx context.Context, e *Engine, t pgx.Tx, name string, in In, opts *ScheduleOpts) error {
	if e == nil || t == nil {
		return errors.New("workflow: ScheduleTx needs an engine and a transaction")
	}
	if d, ok := e.workflows[w.name]; !ok || d != Definition(w) {
		return fmt.Errorf("workflow: a schedule of %q needs the workflow registered with this engine; add it to Config.Workflows", w.name)
	}
	if opts == nil {
		opts = &ScheduleOpts{}
	}
	p, tm, err := scheduleParams(name, opts)
	if err != nil {
		return err
	}
	input, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("workflow: error encoding input of type %T as JSON: %w", in, err)
	}
	if err := e.checkInput(w.name, input); err != nil { // every tick's run gets it
		return err
	}
	p.Workflow, p.Input = w.name, input
	// The input is the same at every tick, and so is the runs' concurrency key: stored with the
	// schedule, it limits them wherever they are fired, by a CLI that knows no workflow too.
	if p.Concurrency, err = w.concurrency(input); err != nil {
		return err
	}
	now, err := e.st.ScheduleNow(ctx, t, e.clockNow())
	if err != nil {
		return fmt.Errorf("workflow: error reading the time: %w", e.tablesError(err))
	}
	if p.NextTick = tm.next(now); p.NextTick.IsZero() {
		return fmt.Errorf("workflow: ScheduleOpts.Cron %q has no tick in the next five years", opts.Cron)
	}
	created, next, err := e.st.ScheduleUpsert(ctx, t, p)
	if err != nil {
		return fmt.Errorf("workflow: error storing schedule %q: %w", name, e.tablesError(err))
	}
	e.log.InfoContext(ctx, "workflow: schedule defined", "schedule", name, "workflow", w.name, "created", created, "next_tick", next)
	return nil
}

// scheduleParams checks a definition and makes its row, but for the workflow and input.
func scheduleParams(name string, o *ScheduleOpts) (store.ScheduleUpsertParams, timing, error) {
	p := store.ScheduleUpsertParams{Name: name, Scope: o.Scope, Cron: o.Cron, Every: o.Every, TimeZone: o.TimeZone,
		Overlap: string(o.Overlap), CatchUp: string(o.CatchUp), Paused: o.Paused}
	if err := validScheduleName(name); err != nil {
		return p, nil, err
	}
	tm, err := parseTiming("ScheduleOpts.", o.Cron, o.Every, o.TimeZone)
	if err != nil {
		return p, nil, err
	}
	if o.Every != 0 && o.TimeZone != "" && o.TimeZone != "UTC" {
		// Checked here, not in parseTiming: a stored schedule that has one keeps firing.
		return p, nil, fmt.Errorf("workflow: ScheduleOpts.TimeZone %q has no effect on Every, which ticks at whole multiples of itself since the Unix epoch; leave TimeZone empty, or use Cron for times of day in a zone (such as \"0 0 * * *\")", o.TimeZone)
	}
	if p.TimeZone == "" {
		p.TimeZone = "UTC"
	}
	if p.Scope == "" {
		p.Scope = DefaultScheduleScope
	}
	if err := (idem.Key{Scope: p.Scope, ID: "x"}).Validate(); err != nil {
		return p, nil, fmt.Errorf("workflow: ScheduleOpts.Scope is not a key's scope: %w", err)
	}
	switch o.Overlap {
	case "":
		p.Overlap = string(OverlapSkip)
	case OverlapSkip, OverlapAllow:
	default:
		return p, nil, fmt.Errorf("workflow: ScheduleOpts.Overlap %q is not an overlap policy; use workflow.OverlapSkip or workflow.OverlapAllow", o.Overlap)
	}
	switch o.CatchUp {
	case "":
		p.CatchUp = string(CatchUpLatest)
	case CatchUpLatest, CatchUpAll, CatchUpSkip:
	default:
		return p, nil, fmt.Errorf("workflow: ScheduleOpts.CatchUp %q is not a catch-up policy; use workflow.CatchUpLatest, CatchUpAll or CatchUpSkip", o.CatchUp)
	}
	if _, ok := o.Attributes[ScheduleAttribute]; ok {
		return p, nil, fmt.Errorf("workflow: ScheduleOpts.Attributes cannot set %q: it is the schedule's name on every run it starts", ScheduleAttribute)
	}
	if len(o.Attributes) >= MaxAttributes {
		return p, nil, fmt.Errorf("workflow: ScheduleOpts.Attributes has %d attributes; with %q a run would have more than %d", len(o.Attributes), ScheduleAttribute, MaxAttributes)
	}
	if err := validateAttributes("ScheduleOpts.Attributes", o.Attributes, false); err != nil {
		return p, nil, err
	}
	p.Attributes = o.Attributes
	return p, tm, nil
}
