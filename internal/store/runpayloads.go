package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// runPayloadsFamily is idem_run_payloads: the large step outputs, signal payloads and event
// values of workflow runs, by the UTC day their run was created on. A run's expiry is unknown
// while it runs (it may sleep for months), but its creation is fixed, so the partition of day D
// holds payloads of runs created on D only. Once D and one more day have passed (for a write
// that began near midnight), and no run created on D is left in idem_runs (one probe of
// idem_runs_created), nothing can point into it: every owner row (step, signal, event) goes with
// its run. A run that lives long pins its own start day only. Runs are created by the database's
// clock, so no new run can be created on a day two days past (a virtual clock, in tests, may;
// its payloads stay inline when their day has no partition).
var runPayloadsFamily = payloadFamily{
	base:  "idem_run_payloads",
	table: func(t Tables) string { return t.RunPayloads },
	// Runs start today; the days ahead are there for a reaper that does not run for a while.
	ahead: 7,
	droppable: `SELECT $1::date + 2 <= ` + utcDay("now()") + ` AND NOT EXISTS (
	SELECT FROM {runs} WHERE created_at >= $1::date::timestamp AT TIME ZONE 'UTC'
		AND created_at < ($1::date + 1)::timestamp AT TIME ZONE 'UTC')`,
}

// The kinds of a run's payloads in idem_run_payloads, and what their ref holds.
const (
	payloadStep   = "s" // a step's output; ref: the step's seq
	payloadSignal = "g" // a signal's payload; ref: the signal's seq
	payloadEvent  = "e" // an event's value; ref: the event's name
)

// runPayloadDay is the SQL of the date naming the partition of idem_run_payloads for a run
// created at the timestamptz expression created, or NULL when that partition does not exist (a
// payload then stays in its owner's row).
func (t Tables) runPayloadDay(created string) string {
	return `CASE WHEN to_regclass(` + t.partitionNameSQL(runPayloadsFamily.base, utcDay(created)) + `) IS NOT NULL THEN ` + utcDay(created) + ` END`
}

// runPayloadStore is the SQL of a data-modifying CTE's body that stores the payload data (an
// expression) of kind, owned by scope and id under ref, in the partition of day, from the rows of
// from (a FROM list) where day is not null. idem_run_payload_put writes each row into its
// partition by name (an INSERT routed through idem_run_payloads would fail if that partition was
// attached while the statement ran); the INSERT around it only makes the CTE one that Postgres
// always runs, and receives a row only if the partition vanished after runPayloadDay saw it,
// where it fails loudly rather than lose the payload. A step's output or an event's value may
// find a row left there under the same ref (by an earlier run under the same key that started
// on the same day, by steps an operator cut, by the event's last write), which it overwrites. A
// signal's ref is its seq, from a sequence, which no other row had: it is inserted plainly,
// without the speculative insertion ON CONFLICT costs.
func (t Tables) runPayloadStore(kind, day, scope, id, ref, data, from string) string {
	upsert := "true"
	if kind == payloadSignal {
		upsert = "false"
	}
	return `INSERT INTO {run_payloads} (day, scope, id, kind, ref, data)
	SELECT ` + day + `, ` + scope + `, ` + id + `, '` + kind + `', ` + ref + `, ` + data + ` FROM ` + from + `
	WHERE ` + day + ` IS NOT NULL AND NOT ` + t.qualify("idem_run_payload_put") + `(` + t.partitionNameSQL(runPayloadsFamily.base, day) +
		`, ` + day + `, ` + scope + `, ` + id + `, '` + kind + `', ` + ref + `, ` + data + `, ` + upsert + `)`
}

// createdAt is the SQL of the timestamptz of a run's creation passed as param in µs since the
// epoch, as the engine keeps it.
func createdAt(param string) string { return `('epoch'::timestamptz + ` + param + `::int8 @us)` }

// ErrPayloadMissing means that a payload an owner row points to is not in its partition of
// idem_run_payloads. The reaper drops a partition only when no run created on its day is left,
// so for a run that exists it means that the partition was dropped by hand.
var ErrPayloadMissing = errors.New("store: a large payload is missing from its partition")

// largeRef is a payload that an owner row keeps in idem_run_payloads: its day and ref, and where
// to put its bytes.
type largeRef struct {
	day time.Time
	ref string
	dst *[]byte
}

// loadRunPayloads reads the large payloads of kind of the run scope/id that refs name, from the
// one partition of each day (a run's payloads are all in its start day's, so one query), and
// puts each where its ref says. A missing partition or row is ErrPayloadMissing.
func (st *Statements) loadRunPayloads(ctx context.Context, q Querier, scope, id, kind string, refs []largeRef) error {
	for len(refs) > 0 {
		day := refs[0].day
		byRef := map[string]*[]byte{}
		var names []string
		rest := refs[:0:0]
		for _, r := range refs {
			if !r.day.Equal(day) {
				rest = append(rest, r)
				continue
			}
			byRef[r.ref] = r.dst
			names = append(names, r.ref)
		}
		refs = rest
		part := PartitionName(runPayloadsFamily.base, day)
		// day is every row's there, and the primary key's first column: without it the key's
		// index could not be searched.
		sql := `SELECT ref, data FROM ` + st.Tables.qualify(part) + ` WHERE day = $4 AND scope = $1 AND id = $2 AND kind = '` + kind + `' AND ref = ANY($3::text[])`
		rows, err := q.Query(ctx, sql, scope, id, names, day)
		if err != nil {
			if IsMissingTable(err) {
				return fmt.Errorf("%w: %s is gone", ErrPayloadMissing, part)
			}
			return err
		}
		var (
			ref  string
			data []byte
		)
		found := 0
		_, err = pgx.ForEachRow(rows, []any{&ref, &data}, func() error {
			if dst := byRef[ref]; dst != nil {
				*dst, found = data, found+1
				data = nil
			}
			return nil
		})
		if err != nil {
			if IsMissingTable(err) {
				return fmt.Errorf("%w: %s is gone", ErrPayloadMissing, part)
			}
			return err
		}
		if found < len(byRef) {
			return fmt.Errorf("%w: %d of the %d payloads of run %q in scope %q in %s", ErrPayloadMissing, len(byRef)-found, len(byRef), id, scope, part)
		}
	}
	return nil
}

// seqRef is a step's or a signal's ref in idem_run_payloads.
func seqRef[T int | int64](seq T) string { return strconv.FormatInt(int64(seq), 10) }
