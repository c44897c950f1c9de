package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/telemetry"
	"github.com/idemkit/idem/tx"
)

// Beginner begins a transaction. *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx (a
// savepoint) satisfy it. It is tx.Beginner: one interface for the same thing across idem.
//
//	var db idem.Beginner = pool // or conn, or an open pgx.Tx
//	err := idem.Migrate(ctx, db)
type Beginner = tx.Beginner

// Querier sends statements: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx satisfy it.
//
//	var db idem.Querier = pool
//	n, err := idem.Reap(ctx, db)
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Reap defaults; see the options of the same names.
const (
	DefaultReapBusy      = 0.25
	DefaultReapBatchTime = 25 * time.Millisecond
)

// Reap deletes what has expired: keys of [Do] past their [TTL] (the inboxes of package outbox
// keep theirs there too), finished workflow runs past theirs, with their steps, and outbox
// messages published longer ago than [OutboxRetention]. A run still running is never deleted,
// whatever its age, nor an outbox message that is not published (a dead-lettered one waits for
// an operator). It works in short batches, each a statement of its own, oldest first, until
// nothing expired is left, ctx ends, or [ReapMax] rows are gone; it returns how many keys, runs
// and messages it deleted.
//
// Reap paces itself so that it does not crowd out the traffic that writes keys, and needs no
// tuning for it: it measures each batch, sizes the next to take about [ReapBatchTime], and rests
// between batches so that it works [ReapBusy] of the time (a quarter, by default) while its
// batches go at the best speed per row it has seen. When they slow down, the traffic has the
// server's CPU, locks or disk, and Reap rests longer in proportion (up to twice as long), taking
// its share back when the traffic eases. A key costs it one lock and one delete found on the
// expiry index: with 8 clients running [Do] flat out on two cores, it drained a backlog two to
// three times as fast as the clients wrote keys, and left their p99 where it was. Call it from a ticker, or register the River job in
// package idemriver (the workflow engine runs that job already). Several reapers at once share
// the work: each skips the rows another holds, so none waits, fails or deadlocks.
//
//	n, err := idem.Reap(ctx, pool)
//	log.Printf("reaped %d expired keys", n)
//
// Results over 1 KiB are not deleted one by one: Do keeps them in idem_results, partitioned by the
// UTC day their key expires on, and Reap drops a day's partition whole (one catalog change, no
// WAL per row, nothing for vacuum) once that day and one more have passed, with DETACH PARTITION
// CONCURRENTLY so that no reader or writer of the table waits for it. It also makes the
// partitions of the days ahead (Migrate makes the first ones); a result whose day has no
// partition yet stays in its key's row, so nothing depends on Reap having run. Dropping needs db
// to be a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn: given a transaction (or a type of its own),
// Reap leaves the drops to a later Reap on one of those, and logs a warning; a role that may not
// create tables leaves results inline, with a warning too. Neither fails the call.
// Outbox message bodies over 1 KiB are in idem_outbox_payloads, by the UTC day of their Append,
// and go the same way, once no message of that day is left in idem_outbox.
//
// A deleted key is free again: the next call with it runs afresh. That is the meaning of the TTL,
// and Reap only makes it hold on disk too; before Reap gets to them, expired keys are treated as
// new already.
func Reap(ctx context.Context, db Querier, opts ...Option) (int64, error) {
	rep, err := ReapWithReport(ctx, db, opts...)
	return rep.Total(), err
}

// ReapReport is what one [ReapWithReport] did.
type ReapReport struct {
	Keys   int64 // keys of Do (and of outbox inboxes) deleted
	Runs   int64 // finished workflow runs deleted, with their steps
	Outbox int64 // published outbox messages deleted
	// PartitionsCreated and PartitionsDropped name the payload tables' partitions made for the
	// days ahead and dropped whole, schema-qualified and quoted as in SQL.
	PartitionsCreated, PartitionsDropped []string
	// PartitionsSkipped says why partition upkeep was left for a later Reap without failing
	// this one: db is a transaction, the role may not create or drop tables, or a lock was not
	// granted in time. Large payloads stay in their rows meanwhile, which is correct, only
	// dearer to delete. (Errors marshal to JSON as {}: log their Error().)
	PartitionsSkipped []error
}

// Total is the rows deleted, as [Reap] returns it: Keys + Runs + Outbox.
//
//	rep, err := idem.ReapWithReport(ctx, pool)
//	log.Printf("reaped %d rows", rep.Total())
func (r ReapReport) Total() int64 { return r.Keys + r.Runs + r.Outbox }

// ReapWithReport is [Reap], returning what it did in detail: rows deleted of each kind, and the
// payload partitions it made, dropped or left for later. On an error, the report holds what was
// done before it.
//
//	rep, err := idem.ReapWithReport(ctx, pool)
//	if err != nil {
//		return err
//	}
//	for _, why := range rep.PartitionsSkipped {
//		log.Printf("partition upkeep left for later: %v", why)
//	}
func ReapWithReport(ctx context.Context, db Querier, opts ...Option) (ReapReport, error) {
	var rep ReapReport
	cfg := newConfig(opts)
	if cfg.err != nil {
		return rep, cfg.err
	}
	if db == nil {
		return rep, errors.New("idem: Reap needs a database; db is nil")
	}
	st := store.For(cfg.schema)
	tel := telemetry.For(cfg.tracerProvider, cfg.meterProvider)
	ctx, span := tel.Tracer.Start(ctx, "idem.Reap", trace.WithSpanKind(trace.SpanKindInternal))
	defer span.End()
	r := &reaper{cfg: cfg, tel: tel, pace: pacer{busy: cfg.reapBusy, batchTime: cfg.reapBatchTime}}
	var after *time.Time // where the last batch of keys ended
	keys, err := r.drain(ctx, "do", 500, func(ctx context.Context, limit int) (int64, int64, error) {
		n, last, err := st.ReapKeys(ctx, db, limit, after)
		if last != nil {
			after = last
		}
		return n, n, err
	})
	var runs int64
	if err == nil {
		// Runs take their steps with them: start smaller.
		var afterRun *time.Time // where the last batch of runs ended
		runs, err = r.drain(ctx, "run", 100, func(ctx context.Context, limit int) (int64, int64, error) {
			n, looked, last, err := st.ReapRuns(ctx, db, limit, afterRun)
			if last != nil {
				afterRun = last
			}
			return n, looked, err
		})
	}
	var msgs int64
	if err == nil {
		var afterMsg *uuid.UUID // where the last batch of messages ended
		msgs, err = r.drain(ctx, "outbox", 500, func(ctx context.Context, limit int) (int64, int64, error) {
			n, last, err := st.ReapOutbox(ctx, db, limit, cfg.outboxRetention.Microseconds(), afterMsg)
			if last != nil {
				afterMsg = last
			}
			return n, n, err
		})
	}
	var parts store.PartitionsReport
	if err == nil {
		// Last: dropping a partition may wait for transactions that read its table to end.
		parts, err = st.MaintainPartitions(ctx, db)
		if len(parts.Created)+len(parts.Dropped) > 0 {
			cfg.logger().InfoContext(ctx, "idem: payload partitions made and dropped", "created", parts.Created, "dropped", parts.Dropped)
		}
		for _, skipped := range parts.Skipped {
			cfg.logger().WarnContext(ctx, "idem: payload partitions left for a later reap; large payloads stay in their rows meanwhile",
				"error", skipped)
		}
		if err != nil {
			err = fmt.Errorf("idem: error maintaining the payload partitions: %w", tablesError(err))
		}
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.Int64("idem.reaped.do", keys), attribute.Int64("idem.reaped.run", runs),
			attribute.Int64("idem.reaped.outbox", msgs), attribute.Int("idem.partitions.created", len(parts.Created)),
			attribute.Int("idem.partitions.dropped", len(parts.Dropped)))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	rep = ReapReport{Keys: keys, Runs: runs, Outbox: msgs, PartitionsCreated: parts.Created, PartitionsDropped: parts.Dropped,
		PartitionsSkipped: parts.Skipped}
	return rep, err
}

type reaper struct {
	cfg   *config
	tel   *telemetry.Set
	pace  pacer
	total int64
}

// drain deletes in batches with del, each of batch rows to begin with, until a batch comes back
// short, and counts what it deleted in the metric under what ("do", "run" or "outbox"), as the
// log does. del returns the rows it deleted and the rows it looked at, which are more when it
// keeps some (a finished child whose parent is unfinished): a batch is short when it looked at
// fewer than its limit, not when it kept some.
func (r *reaper) drain(ctx context.Context, what string, batch int, del func(ctx context.Context, limit int) (deleted, looked int64, err error)) (deleted int64, _ error) {
	defer func() {
		r.tel.Reaped.Add(ctx, deleted, metric.WithAttributeSet(attribute.NewSet(telemetry.What.String(what))))
	}()
	r.pace.start(batch)
	for {
		limit := r.pace.batch
		if r.cfg.reapMax > 0 {
			left := r.cfg.reapMax - r.total
			if left <= 0 {
				return deleted, nil
			}
			limit = int(min(int64(limit), left))
		}
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("idem: stopped reaping after %d keys: %w", deleted, err)
		}
		start := time.Now()
		n, looked, err := del(ctx, limit)
		took := time.Since(start)
		if err != nil {
			return deleted, fmt.Errorf("idem: error deleting expired keys (after %d): %w", deleted, tablesError(err))
		}
		deleted += n
		r.total += n
		if looked < int64(limit) {
			r.cfg.logger().DebugContext(ctx, "idem: reaped a batch of expired keys", "what", what, "keys", n, "limit", limit, "took", took)
			return deleted, nil
		}
		rest, pressure := r.pace.done(int(looked), limit, took)
		r.cfg.logger().DebugContext(ctx, "idem: reaped a batch of expired keys", "what", what, "keys", n, "limit", limit, "took", took,
			"pressure", pressure, "rest", rest)
		if err := backoff.Sleep(ctx, rest); err != nil {
			return deleted, fmt.Errorf("idem: stopped reaping after %d keys: %w", deleted, err)
		}
	}
}
