package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements read the time in one place: where their source says {now} (the transaction's
// time) or {statement_now} (the statement's), render writes the clock's expression. Production
// statements read Postgres's own clock, now() and statement_timestamp(), and their texts are
// exactly what they were before the seam (TestStatementTexts holds them to a golden file). The
// statements of a test engine (package workflowtest) read a virtual clock instead: a time kept
// in a table of the test's database, which stands still until the test moves it forward. Leases,
// sleeps, await timeouts, deadlines and expiries all follow it, since they are all arithmetic on
// {now} in these statements. A clock that stands still, rather than Postgres's plus an offset,
// makes a test's times exact (a 30-day sleep wakes at exactly its start plus 30 days) and its
// runs' fate depend on the moves the test makes, not on how fast the machine is.

// clock is the pair of expressions the statements read the time with.
type clock struct {
	now, statementNow string
}

var postgresClock = clock{now: "now()", statementNow: "statement_timestamp()"}

// ClockTable is the table that holds a virtual clock's time, in the schema of idem's tables.
const ClockTable = "idem_test_clock"

// clockTable names the virtual clock's table in schema.
func clockTable(schema string) string { return qualified(schema, ClockTable) }

// qualified names table in schema; "" leaves it unqualified, for search_path to find.
func qualified(schema, table string) string {
	if schema == "" {
		return table
	}
	return pgx.Identifier{schema, table}.Sanitize()
}

func virtualClock(schema string) clock {
	now := "('epoch'::timestamptz + (SELECT now_us FROM " + clockTable(schema) + ") * interval '1 microsecond')"
	return clock{now: now, statementNow: now}
}

// ForVirtualClock returns the statements for schema that read a virtual clock (see
// VirtualClockCreate) instead of Postgres's: the test engine's.
func ForVirtualClock(schema string) *Statements {
	return statementsFor(cacheKey{schema: schema, virtual: true})
}

// VirtualClockCreate creates the virtual clock's table in the statements' schema, set to
// Postgres's time, unless it exists. The statements of ForVirtualClock fail without it.
func (st *Statements) VirtualClockCreate(ctx context.Context, q Querier) error {
	t := clockTable(st.schema)
	_, err := q.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (now_us int8 NOT NULL);
INSERT INTO `+t+` (now_us) SELECT `+epochUS("now()")+` WHERE NOT EXISTS (SELECT FROM `+t+`)`)
	return err
}

// VirtualClockSet sets the virtual clock to t (to the microsecond).
func (st *Statements) VirtualClockSet(ctx context.Context, q Querier, t time.Time) error {
	_, err := q.Exec(ctx, `UPDATE `+clockTable(st.schema)+` SET now_us = $1`, t.UnixMicro())
	return err
}

// ClockNow reads the time as the statements read it: Postgres's clock, or the virtual one.
func (st *Statements) ClockNow(ctx context.Context, q Querier) (time.Time, error) {
	var us int64
	err := q.QueryRow(ctx, st.Tables.render(`SELECT `+epochUS("{now}"))).Scan(&us)
	return usTime(us), err
}

// usTime is a time in µs since the epoch, as the statements return times, read into time.Time.
func usTime(us int64) time.Time { return time.UnixMicro(us) }

// epochUS spells a timestamptz expression as µs since the epoch.
func epochUS(expr string) string {
	return "(extract(epoch FROM " + expr + ") * 1000000)::int8"
}

// JobsTable keeps a test engine's jobs: the wake-ups and resumes that a production engine inserts
// into River, written in the same transactions, and run by the test engine (package
// workflowtest) when its virtual clock reaches them.
const JobsTable = "idem_test_jobs"

// TestJobsCreate creates the test engine's jobs table in the statements' schema, unless it exists.
func (st *Statements) TestJobsCreate(ctx context.Context, q Querier) error {
	_, err := q.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+qualified(st.schema, JobsTable)+` (
	id     bigserial PRIMARY KEY,
	kind   text NOT NULL,
	args   bytea NOT NULL,
	run_at timestamptz NOT NULL
)`)
	return err
}

// TestJobInsert keeps a job of kind with args (JSON), due at at, or at once (by the statements'
// clock) when at is zero.
func (st *Statements) TestJobInsert(ctx context.Context, q Querier, kind string, args []byte, at time.Time) error {
	var atArg any
	if !at.IsZero() {
		atArg = at
	}
	_, err := q.Exec(ctx, st.Tables.render(`INSERT INTO `+qualified(st.schema, JobsTable)+` (kind, args, run_at)
VALUES ($1, $2, coalesce($3::timestamptz, {now}))`), kind, args, atArg)
	return err
}

// TestJob is a kept job.
type TestJob struct {
	Kind  string
	Args  []byte
	RunAt time.Time
}

// TestJobTake deletes and returns the job due first at or before until, in the order they are
// due, then kept; ok is false when none is.
func (st *Statements) TestJobTake(ctx context.Context, q Querier, until time.Time) (j TestJob, ok bool, err error) {
	t := qualified(st.schema, JobsTable)
	err = q.QueryRow(ctx, `DELETE FROM `+t+` WHERE id = (SELECT id FROM `+t+` WHERE run_at <= $1 ORDER BY run_at, id LIMIT 1)
RETURNING kind, args, run_at`, until).Scan(&j.Kind, &j.Args, &j.RunAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return TestJob{}, false, nil
	}
	return j, err == nil, err
}

// TestJobNext says when the first kept job is due; ok is false when none is kept.
func (st *Statements) TestJobNext(ctx context.Context, q Querier) (at time.Time, ok bool, err error) {
	var next *time.Time
	if err := q.QueryRow(ctx, `SELECT min(run_at) FROM `+qualified(st.schema, JobsTable)).Scan(&next); err != nil || next == nil {
		return time.Time{}, false, err
	}
	return *next, true, nil
}
