package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Payloads dropped, not deleted (docs/design/payloads.md). What must be unique stays in narrow,
// unpartitioned tables (idem_keys, idem_runs, idem_steps, idem_outbox, ...); the bytes of a large
// payload go to a table partitioned by day, one partition per UTC day, which the reaper drops
// whole once nothing live can point into it. A drop is one catalog change whatever the partition
// holds: no WAL per row, no TOAST chunk to delete, nothing for vacuum.
//
// A payload of at most PayloadInlineMax bytes stays in its owner's row, as before: the common
// small result costs nothing new. A larger one goes to the partition of its day only if that
// partition exists when it is written (the writer's statement asks to_regclass, a catalog cache
// probe); otherwise it stays inline too. So a write never waits for, nor fails on, a missing
// partition: correctness never depends on the reaper having run, only the cost of deleting does.
// There is no DEFAULT partition, because a row in it would stop the reaper from creating the
// partition of that row's day.
//
// Partitions are made ahead by the reaper (and by Migrate) with CREATE TABLE and ATTACH
// PARTITION, which takes SHARE UPDATE EXCLUSIVE on the parent and so never blocks its readers
// and writers, and dropped with DETACH PARTITION CONCURRENTLY and a DROP TABLE of the detached
// table, for the same reason.

// PayloadInlineMax is the largest payload, in bytes, that stays in its owner's row. Larger ones
// go to their day's partition when it exists. A row up to about 2 KB stays on its heap page; the
// threshold sits below that so that the rows of the narrow tables stay several to a page.
const PayloadInlineMax = 1024

// inlineMax is PayloadInlineMax, or what a benchmark set with SetPayloadInlineMax.
var inlineMax atomic.Int64

func init() { inlineMax.Store(PayloadInlineMax) }

// large reports whether a payload of n bytes goes to a partition (when its day has one).
func large(n int) bool { return int64(n) > inlineMax.Load() }

// SetPayloadInlineMax changes the inline threshold for the whole process and returns a function
// that restores it. Benchmarks use it to measure the same statements with every payload inline,
// as idem stored them before the payload tables; nothing else should.
func SetPayloadInlineMax(n int) (restore func()) {
	old := inlineMax.Swap(int64(n))
	return func() { inlineMax.Store(old) }
}

// payloadFamily is one table partitioned by day (RANGE on its first column, day date, with a
// primary key that starts with day) that holds large payloads.
type payloadFamily struct {
	// base is the parent's unqualified name; its partitions are base_pYYYYMMDD.
	base string
	// table is the parent's qualified name.
	table func(Tables) string
	// ahead is how many days past today the reaper keeps partitions ready for (today and the
	// day before are always kept ready).
	ahead int
	// droppable is a statement rendered with Tables.render that returns one bool for the
	// partition of day $1 (date): true when no live row can point into it any more.
	droppable string
}

// payloadFamilies are the payload tables the reaper maintains, in the order it visits them.
var payloadFamilies = []payloadFamily{resultsFamily, outboxPayloadsFamily, runPayloadsFamily}

// PartitionName is the unqualified name of base's partition for day (taken in UTC).
func PartitionName(base string, day time.Time) string {
	return base + "_p" + day.UTC().Format("20060102")
}

// utcDay is the SQL of the UTC day of the timestamptz expression ts.
func utcDay(ts string) string { return "((" + ts + ") AT TIME ZONE 'UTC')::date" }

// partitionNameSQL is the SQL of the text naming base's partition for the date expression day,
// qualified by t's schema as to_regclass reads it.
func (t Tables) partitionNameSQL(base, day string) string {
	prefix, suffix := base+"_p", ""
	if t.schema != "" {
		prefix = pgx.Identifier{t.schema}.Sanitize() + `."` + prefix
		suffix = `"`
	}
	sql := quoteLiteral(prefix) + " || to_char(" + day + ", 'YYYYMMDD')"
	if suffix != "" {
		sql += " || " + quoteLiteral(suffix)
	}
	return sql
}

// qualify names an unqualified table in t's schema.
func (t Tables) qualify(table string) string {
	if t.schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{t.schema, table}.Sanitize()
}

// partitionLockID is the advisory lock that one reaper at a time holds while it makes partitions.
func partitionLockID(schema string) int64 { return lockHash("idem.partitions.v1", LockSchema(schema)) }

// PartitionsReport is what MaintainPartitions did.
type PartitionsReport struct {
	Created, Dropped []string // qualified names
	// Skipped says why some work was left for a later call without failing this one: the role
	// may not create or drop tables (large payloads then stay inline, which is correct, only
	// dearer to delete), or a lock was not granted within the timeout.
	Skipped []error
}

// skippable reports whether err leaves partition upkeep for later rather than failing it:
// insufficient privilege, or a lock timeout.
func skippable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, errNoConcurrentDetach) || (errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "55P03"))
}

// MaintainPartitions makes the payload tables' partitions for yesterday through each table's
// days ahead, and drops those that nothing live points into any more. One caller at a time makes
// partitions (the others skip that part); drops of one partition by two callers at once are
// harmless, the second finds it gone.
//
// Partitions are made with ATTACH, which no reader or writer waits for, on any db (in a
// savepoint when db is a pgx.Tx). They are dropped only when db is a *pgxpool.Pool, a
// *pgxpool.Conn or a *pgx.Conn: a partition is detached CONCURRENTLY, which cannot run in a
// transaction, and a plain DETACH in the caller's transaction would make every reader and writer
// of the table wait until it commits. Otherwise the report's Skipped says so. Insufficient
// privilege and lock timeouts are reported in Skipped too, not as errors.
func (st *Statements) MaintainPartitions(ctx context.Context, db Querier) (PartitionsReport, error) {
	var rep PartitionsReport
	for _, f := range payloadFamilies {
		created, err := st.createPartitions(ctx, db, f)
		rep.Created = append(rep.Created, created...)
		if err != nil && skippable(err) {
			rep.Skipped, err = append(rep.Skipped, err), nil
		}
		if err != nil {
			return rep, err
		}
		dropped, err := st.dropPartitions(ctx, db, f)
		rep.Dropped = append(rep.Dropped, dropped...)
		if err != nil && skippable(err) {
			rep.Skipped, err = append(rep.Skipped, err), nil
		}
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// CreatePartitions makes the payload tables' missing partitions, for yesterday through each
// table's days ahead, and returns their names; see MaintainPartitions.
func (st *Statements) CreatePartitions(ctx context.Context, db Querier) ([]string, error) {
	var made []string
	for _, f := range payloadFamilies {
		created, err := st.createPartitions(ctx, db, f)
		made = append(made, created...)
		if err != nil {
			return made, err
		}
	}
	return made, nil
}

// createPartitions makes f's missing partitions from yesterday to f.ahead days from today and
// returns their names. One statement (a DO block, atomic) makes them, each empty and attached,
// under a lock that one caller at a time holds (the others skip the work), waiting at most 5 s
// for ATTACH's lock, which only maintenance holds (VACUUM, CREATE INDEX CONCURRENTLY, another
// ATTACH or DETACH); the caller's lock_timeout is restored after. Given a transaction, it runs
// in a savepoint, so that a failure leaves the transaction usable.
func (st *Statements) createPartitions(ctx context.Context, db Querier, f payloadFamily) ([]string, error) {
	t := st.Tables
	parent := f.table(t)
	missing := `SELECT d::date, ` + t.partitionNameSQL(f.base, "d::date") + `
FROM generate_series(` + utcDay("now()") + ` - 1, ` + utcDay("now()") + ` + $1::int, interval '1 day') d
WHERE to_regclass(` + t.partitionNameSQL(f.base, "d::date") + `) IS NULL
	AND to_regclass(` + quoteLiteral(parent) + `) IS NOT NULL -- before its migration, nothing to do
ORDER BY 1`
	before, err := partitionDays(ctx, db, missing, f.ahead)
	if err != nil || len(before) == 0 {
		return nil, tableError(parent, "making partitions of", err)
	}
	err = st.runPartitionBlock(ctx, db, f, utcDay("now()")+" - 1", utcDay("now()")+" + "+fmt.Sprint(f.ahead))
	if err != nil {
		return nil, tableError(parent, "making partitions of", err)
	}
	after, err := partitionDays(ctx, db, missing, f.ahead)
	if err != nil {
		return nil, tableError(parent, "making partitions of", err)
	}
	var made []string
	for _, d := range before {
		if !slices.ContainsFunc(after, func(a partitionDay) bool { return a.day.Equal(d.day) }) {
			made = append(made, t.qualify(PartitionName(f.base, d.day)))
		}
	}
	return made, nil
}

// runPartitionBlock makes f's missing partitions for the days from first to last (SQL date
// expressions) in one statement, a DO block, atomic: each table is made empty, given a CHECK
// matching its bound (so that ATTACH skips its scan), and attached (its primary key made by
// ATTACH from the parent's). ATTACH takes SHARE UPDATE EXCLUSIVE on the parent: readers and
// writers never wait for it. Given a transaction, the block runs in a savepoint.
func (st *Statements) runPartitionBlock(ctx context.Context, db Querier, f payloadFamily, first, last string) error {
	t := st.Tables
	parent := f.table(t)
	block := `DO $idem$
DECLARE
	d date;
	n text;
	old text := current_setting('lock_timeout');
BEGIN
	IF NOT pg_try_advisory_xact_lock(` + fmt.Sprint(partitionLockID(st.schema)) + `) THEN
		RETURN;
	END IF;
	PERFORM set_config('lock_timeout', '5s', true);
	FOR d IN SELECT g::date FROM generate_series(` + first + `, ` + last + `, interval '1 day') g LOOP
		n := ` + t.partitionNameSQL(f.base, "d") + `;
		IF to_regclass(n) IS NULL THEN
			n := ` + quoteLiteral(schemaPrefix(t)) + ` || quote_ident(` + quoteLiteral(f.base+"_p") + ` || to_char(d, 'YYYYMMDD'));
			EXECUTE format('CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS)', n, ` + quoteLiteral(parent) + `);
			EXECUTE format('ALTER TABLE %s ADD CHECK (day >= %L AND day < %L)', n, d, d + 1);
			EXECUTE format('ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%L) TO (%L)', ` + quoteLiteral(parent) + `, n, d, d + 1);
		END IF;
	END LOOP;
	PERFORM set_config('lock_timeout', old, true);
END
$idem$`
	if tx, ok := db.(pgx.Tx); ok {
		return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { _, err := sp.Exec(ctx, block); return err })
	}
	_, err := db.Exec(ctx, block)
	return err
}

// MakePartitions makes the partitions of the payload table base (idem_results,
// idem_outbox_payloads, idem_run_payloads) for the UTC days from first to last that are missing,
// as the reaper makes those ahead. Tests and benchmarks use it for days in the past.
func (st *Statements) MakePartitions(ctx context.Context, db Querier, base string, first, last time.Time) error {
	i := slices.IndexFunc(payloadFamilies, func(f payloadFamily) bool { return f.base == base })
	if i < 0 {
		return fmt.Errorf("store: %q is not a payload table", base)
	}
	date := func(d time.Time) string { return quoteLiteral(d.UTC().Format(time.DateOnly)) + "::date" }
	return st.runPartitionBlock(ctx, db, payloadFamilies[i], date(first), date(last))
}

// schemaPrefix is t's schema as an identifier followed by a dot, or "" without one.
func schemaPrefix(t Tables) string {
	if t.schema == "" {
		return ""
	}
	return pgx.Identifier{t.schema}.Sanitize() + "."
}

type partitionDay struct {
	day  time.Time
	name string
}

func partitionDays(ctx context.Context, q Querier, sql string, ahead int) ([]partitionDay, error) {
	rows, err := q.Query(ctx, sql, ahead)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (partitionDay, error) {
		var d partitionDay
		err := r.Scan(&d.day, &d.name)
		return d, err
	})
}

// quoteLiteral is s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// tableError says what failed on which table, or is nil.
func tableError(table, what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %s: %w", what, table, err)
}

// dropPartitions drops f's partitions that f.droppable says nothing points into, and detached
// tables of f's left by an earlier drop that did not finish. f.droppable is asked before the
// detach and again after it, before the drop; a partition it no longer allows is attached again.
func (st *Statements) dropPartitions(ctx context.Context, db Querier, f payloadFamily) ([]string, error) {
	t := st.Tables
	parent := f.table(t)
	// Every table named like a partition of f's in the parent's schema, attached or not, and the
	// database's today.
	rows, err := db.Query(ctx, `SELECT c.relname, c.relispartition, coalesce(i.inhdetachpending, false), `+utcDay("now()")+`
FROM pg_class c LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass($1))
	AND c.relkind = 'r' AND c.relname ~ ('^' || $2 || '_p[0-9]{8}$')
	AND (NOT c.relispartition OR i.inhparent = to_regclass($1))
ORDER BY c.relname`, parent, f.base)
	if err != nil {
		return nil, fmt.Errorf("listing partitions of %s: %w", parent, err)
	}
	type part struct {
		name              string
		attached, pending bool
		day               time.Time
	}
	var (
		parts []part
		today time.Time
	)
	for rows.Next() {
		var p part
		if err := rows.Scan(&p.name, &p.attached, &p.pending, &today); err != nil {
			rows.Close()
			return nil, err
		}
		day, err := time.Parse("20060102", p.name[len(p.name)-8:])
		if err != nil {
			continue // not one of ours
		}
		p.day = day
		parts = append(parts, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing partitions of %s: %w", parent, err)
	}
	// DETACH CONCURRENTLY cannot run in a transaction, and a plain DETACH in the caller's
	// transaction would hold the parent's ACCESS EXCLUSIVE lock, which every writer and reader of
	// a large payload waits for (they lock the parent too), until the caller commits. So drops
	// happen only on what is known to run each statement on its own.
	concurrently := false
	switch db.(type) {
	case *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn:
		concurrently = true
	}
	var dropped []string
	for _, p := range parts {
		// A partition of today, yesterday or a day ahead is never dropped, whatever its table
		// says: writers may be routing to it right now.
		if !p.day.Before(today.AddDate(0, 0, -1)) {
			continue
		}
		name := t.qualify(p.name)
		droppable := func() (ok bool, err error) {
			if err := db.QueryRow(ctx, t.render(f.droppable), p.day).Scan(&ok); err != nil {
				return false, fmt.Errorf("deciding whether %s can go: %w", name, err)
			}
			return ok, nil
		}
		if p.attached {
			ok, err := droppable()
			if err != nil {
				return dropped, err
			}
			if !ok {
				continue
			}
			if !concurrently {
				return dropped, errNoConcurrentDetach
			}
			detach := "ALTER TABLE " + parent + " DETACH PARTITION " + name + " CONCURRENTLY"
			if p.pending {
				detach = "ALTER TABLE " + parent + " DETACH PARTITION " + name + " FINALIZE"
			}
			if _, err := db.Exec(ctx, detach); err != nil {
				if gone(err) {
					continue
				}
				return dropped, fmt.Errorf("detaching %s: %w", name, err)
			}
		}
		if !concurrently {
			return dropped, errNoConcurrentDetach
		}
		// Ask again: the detach waited for every transaction that had written to the partition,
		// so a row pointing into it that committed since the first answer is seen now. Then the
		// partition goes back, and a detached table left by an earlier drop is dropped only if
		// the rule allows it too.
		if ok, err := droppable(); err != nil || !ok {
			if err == nil {
				from, to := p.day.Format(time.DateOnly), p.day.AddDate(0, 0, 1).Format(time.DateOnly)
				_, err = db.Exec(ctx, "ALTER TABLE "+parent+" ATTACH PARTITION "+name+" FOR VALUES FROM ('"+from+"') TO ('"+to+"')")
				err = tableError(name, "attaching again", err)
			}
			if err != nil {
				return dropped, err
			}
			continue
		}
		if _, err := db.Exec(ctx, "DROP TABLE IF EXISTS "+name); err != nil {
			return dropped, fmt.Errorf("dropping %s: %w", name, err)
		}
		dropped = append(dropped, name)
	}
	return dropped, nil
}

// errNoConcurrentDetach is why partitions that could go were left: the reaper was given a
// transaction, or a type it cannot tell from one.
var errNoConcurrentDetach = errors.New("payload partitions that could be dropped were left: dropping them needs a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn, which run each statement on its own (a partition is detached CONCURRENTLY, which cannot run in a transaction)")

// gone reports whether err says that the partition is no longer there to detach: another
// reaper got to it first.
func gone(err error) bool {
	var pgErr *pgconn.PgError
	return IsMissingTable(err) || (errors.As(err, &pgErr) && pgErr.Code == "55000")
}
