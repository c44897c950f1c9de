package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
var payloadFamilies = []payloadFamily{resultsFamily}

// PartitionName is the unqualified name of base's partition for day (taken in UTC).
func PartitionName(base string, day time.Time) string {
	return base + "_p" + day.UTC().Format("20060102")
}

// utcDay is the SQL of the UTC day of the timestamptz expression ts.
func utcDay(ts string) string { return "((" + ts + ") AT TIME ZONE 'UTC')::date" }

// partitionExists is the SQL of a bool: whether base's partition for the date expression day
// exists (in t's schema, or on search_path when t names none). Writers ask it in the statement
// that writes, so that a payload whose day has no partition stays inline.
func (t Tables) partitionExists(base, day string) string {
	return "(to_regclass(" + t.partitionNameSQL(base, day) + ") IS NOT NULL)"
}

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
	return errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "55P03")
}

// MaintainPartitions makes the payload tables' partitions for yesterday through each table's
// days ahead, and drops those that nothing live points into any more. One caller at a time makes
// partitions (the others skip that part); drops of one partition by two callers at once are
// harmless, the second finds it gone.
//
// db must be able to begin a transaction (a pool, a connection or a transaction). Given a pool
// or a connection, a partition is detached CONCURRENTLY, which never blocks the table's readers
// and writers; given a transaction, which cannot run that, it is detached plainly, which takes
// the parent's ACCESS EXCLUSIVE lock for a moment.
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
// returns their names. Each is made empty and attached in one transaction, under a lock that one
// caller at a time holds (the others skip the work).
func (st *Statements) createPartitions(ctx context.Context, db Querier, f payloadFamily) ([]string, error) {
	t := st.Tables
	parent := f.table(t)
	missing := `SELECT d::date, ` + t.partitionNameSQL(f.base, "d::date") + `
FROM generate_series(` + utcDay("now()") + ` - 1, ` + utcDay("now()") + ` + $1::int, interval '1 day') d
WHERE to_regclass(` + t.partitionNameSQL(f.base, "d::date") + `) IS NULL
	AND to_regclass(` + quoteLiteral(parent) + `) IS NOT NULL -- before its migration, nothing to do
ORDER BY 1`
	days, err := partitionDays(ctx, db, missing, f.ahead)
	if err != nil || len(days) == 0 {
		return nil, tableError(parent, "making partitions of", err)
	}
	b, ok := db.(beginner)
	if !ok {
		return nil, nil
	}
	var made []string
	err = pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		made = made[:0]
		var locked bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, partitionLockID(st.schema)).Scan(&locked); err != nil || !locked {
			return err
		}
		// ATTACH waits for SHARE UPDATE EXCLUSIVE, which only maintenance (VACUUM, CREATE INDEX
		// CONCURRENTLY, another ATTACH or DETACH) holds: wait a little, then leave it for later.
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		days, err := partitionDays(ctx, tx, missing, f.ahead)
		if err != nil {
			return err
		}
		for _, d := range days {
			name := t.qualify(PartitionName(f.base, d.day))
			from, to := d.day.Format(time.DateOnly), d.day.AddDate(0, 0, 1).Format(time.DateOnly)
			// The CHECK lets ATTACH skip its scan; the partition's primary key is made by
			// ATTACH from the parent's.
			for _, sql := range []string{
				"CREATE TABLE " + name + " (LIKE " + parent + " INCLUDING DEFAULTS)",
				"ALTER TABLE " + name + " ADD CHECK (day >= '" + from + "' AND day < '" + to + "')",
				"ALTER TABLE " + parent + " ATTACH PARTITION " + name + " FOR VALUES FROM ('" + from + "') TO ('" + to + "')",
			} {
				if _, err := tx.Exec(ctx, sql); err != nil {
					return err
				}
			}
			made = append(made, name)
		}
		return nil
	})
	if err != nil {
		return nil, tableError(parent, "making partitions of", err)
	}
	return made, nil
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

// beginner is what can begin a transaction: a pool, a connection, a transaction.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// dropPartitions drops f's partitions that f.droppable says nothing points into, and detached
// tables of f's left by an earlier drop that did not finish.
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
	_, inTx := db.(pgx.Tx)
	var dropped []string
	for _, p := range parts {
		// A partition of today, yesterday or a day ahead is never dropped, whatever its table
		// says: writers may be routing to it right now.
		if !p.day.Before(today.AddDate(0, 0, -1)) {
			continue
		}
		name := t.qualify(p.name)
		if p.attached {
			var ok bool
			if err := db.QueryRow(ctx, t.render(f.droppable), p.day).Scan(&ok); err != nil {
				return dropped, fmt.Errorf("deciding whether %s can go: %w", name, err)
			}
			if !ok {
				continue
			}
			detach := "ALTER TABLE " + parent + " DETACH PARTITION " + name
			switch {
			case p.pending:
				detach += " FINALIZE"
			case !inTx:
				detach += " CONCURRENTLY"
			}
			if _, err := db.Exec(ctx, detach); err != nil {
				if gone(err) {
					continue
				}
				return dropped, fmt.Errorf("detaching %s: %w", name, err)
			}
		}
		if _, err := db.Exec(ctx, "DROP TABLE IF EXISTS "+name); err != nil {
			return dropped, fmt.Errorf("dropping %s: %w", name, err)
		}
		dropped = append(dropped, name)
	}
	return dropped, nil
}

// gone reports whether err says that the partition is no longer there to detach: another
// reaper got to it first.
func gone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "55000")
}
