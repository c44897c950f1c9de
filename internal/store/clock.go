package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements read the time in one place: where their source says {now} (the transaction's
// time) or {statement_now} (the statement's), render writes the clock's expression. Production
// statements read Postgres's own clock, now() and statement_timestamp(), and their texts are
// exactly what they were before the seam (TestStatementTexts holds them to a golden file). The
// statements of a test engine (package workflowtest) read a virtual clock instead: Postgres's
// clock plus an offset kept in a table of the test's database, which the test moves forward.
// Leases, sleeps, await timeouts, deadlines and expiries all follow it, since they are all
// arithmetic on {now} in these statements.

// clock is the pair of expressions the statements read the time with.
type clock struct {
	now, statementNow string
}

var postgresClock = clock{now: "now()", statementNow: "statement_timestamp()"}

// ClockTable is the table of a virtual clock's offset, in the schema of idem's tables.
const ClockTable = "idem_test_clock"

// clockTable names the virtual clock's table in schema.
func clockTable(schema string) string {
	if schema == "" {
		return ClockTable
	}
	return pgx.Identifier{schema, ClockTable}.Sanitize()
}

func virtualClock(schema string) clock {
	offset := "(SELECT offset_us FROM " + clockTable(schema) + ") * interval '1 microsecond'"
	return clock{now: "(now() + " + offset + ")", statementNow: "(statement_timestamp() + " + offset + ")"}
}

// ForVirtualClock returns the statements for schema that read a virtual clock (see
// VirtualClockCreate) instead of Postgres's: the test engine's.
func ForVirtualClock(schema string) *Statements {
	return statementsFor(cacheKey{schema: schema, virtual: true})
}

// VirtualClockCreate creates the virtual clock's table in the statements' schema, at an offset of
// zero, unless it exists. The statements of ForVirtualClock fail without it.
func (st *Statements) VirtualClockCreate(ctx context.Context, q Querier) error {
	t := clockTable(st.schema)
	_, err := q.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (offset_us int8 NOT NULL);
INSERT INTO `+t+` (offset_us) SELECT 0 WHERE NOT EXISTS (SELECT FROM `+t+`)`)
	return err
}

// VirtualClockSet moves the virtual clock to offset after Postgres's own.
func (st *Statements) VirtualClockSet(ctx context.Context, q Querier, offset time.Duration) error {
	_, err := q.Exec(ctx, `UPDATE `+clockTable(st.schema)+` SET offset_us = $1`, micros(offset))
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
