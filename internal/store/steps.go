package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// stepStatements are the texts of the statements on idem_steps and idem_step_attempts.
type stepStatements struct {
	checkpoint, checkpointInFenced, history, attempt, attempts string

	// The same checkpoints for an output over PayloadInlineMax, which goes to idem_run_payloads.
	checkpointLarge, checkpointInFencedLarge string
}

func newStepStatements(t Tables) stepStatements {
	return stepStatements{
		// The fence locks the run's row until COMMIT, so a takeover or a cancel waits for the
		// step to commit or roll back and then sees the new history. When it finds no row (the
		// lease was lost, or the run cancelled), the row it tries to write has no scope, and the
		// NOT NULL constraint fails the statement: a lost lease is an error that aborts the
		// transaction, so the checkpoint can travel with COMMIT and still stop the step's writes
		// from committing.
		checkpoint: t.render(`WITH fence AS (
	SELECT scope, id FROM {runs} WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'
	FOR NO KEY UPDATE
)
INSERT INTO {steps} (scope, id, seq, name, kind, output, error, attempts)
SELECT fence.scope, fence.id, $4, $5, $6, $7, $8, $9 FROM (SELECT) AS one LEFT JOIN fence ON true`),

		checkpointInFenced: t.render(`INSERT INTO {steps} (scope, id, seq, name, kind, output, error, attempts)
SELECT $1, $2, $4, $5, $6, $7, $8, $9 WHERE $3::uuid IS NOT NULL`),

		// The fence's row is the run's: its created_at names the partition of the output, for
		// nothing more than a column of a row the fence reads anyway.
		checkpointLarge: t.render(`WITH fence AS (
	SELECT scope, id, ` + t.runPayloadDay("created_at") + ` AS day
	FROM {runs} WHERE scope = $1 AND id = $2 AND lease_token = $3 AND state = 'running'
	FOR NO KEY UPDATE
), stored AS (
	` + t.runPayloadStore(payloadStep, "day", "$1", "$2", "$4::int4::text", "$7", "fence") + `
)
INSERT INTO {steps} (scope, id, seq, name, kind, output, output_day, error, attempts)
SELECT fence.scope, fence.id, $4, $5, $6, CASE WHEN fence.day IS NULL THEN $7::bytea END, fence.day, $8, $9
FROM (SELECT) AS one LEFT JOIN fence ON true`),

		// The run's creation comes from the engine ($10), which keeps it: no read of the run.
		checkpointInFencedLarge: t.render(`WITH p AS (
	SELECT ` + t.runPayloadDay(createdAt("$10")) + ` AS day WHERE $3::uuid IS NOT NULL
), stored AS (
	` + t.runPayloadStore(payloadStep, "day", "$1", "$2", "$4::int4::text", "$7", "p") + `
)
INSERT INTO {steps} (scope, id, seq, name, kind, output, output_day, error, attempts)
SELECT $1, $2, $4, $5, $6, CASE WHEN p.day IS NULL THEN $7::bytea END, p.day, $8, $9 FROM p`),

		// A large output is NULL here, and output_day names its partition (RunHistory).
		history: t.render(`SELECT seq, name, kind, output, output_day, error, attempts FROM {steps} WHERE scope = $1 AND id = $2 ORDER BY seq`),

		// Written only by the run's owner (the lease is checked, without a row lock: an attempt
		// row is a record, not a recovery point), and trimmed to the newest $10 of its step.
		attempt: t.render(`WITH added AS (
	INSERT INTO {attempts} (scope, id, seq, name, kind, attempt, outcome, error, version)
	SELECT $1, $2, $4, $5, $6, $7, $8, $9, $11
	WHERE EXISTS (SELECT FROM {runs} WHERE scope = $1 AND id = $2 AND lease_token = $3)
	RETURNING n
)
DELETE FROM {attempts} WHERE scope = $1 AND id = $2 AND seq = $4 AND EXISTS (SELECT FROM added)
	AND n NOT IN (SELECT n FROM {attempts} WHERE scope = $1 AND id = $2 AND seq = $4 ORDER BY n DESC LIMIT $10 - 1)`),

		attempts: t.render(`SELECT seq, name, kind, attempt, outcome, error, at, coalesce(version, '') FROM {attempts}
WHERE scope = $1 AND id = $2 ORDER BY n`),
	}
}

// CheckpointParams are a completed step's row: its place in the run, what it was, and its output
// or, when it failed for good, its error.
type CheckpointParams struct {
	LeaseParams
	Seq        int
	Name, Kind string
	Output     []byte
	Error      *string
	Attempts   int
	// Created is the run's created_at, µs since the epoch (its generation): the UTC day of it
	// names the partition of idem_run_payloads that an output over PayloadInlineMax goes to.
	Created int64
}

func (p CheckpointParams) args() []any {
	return []any{p.Scope, p.ID, p.Token, p.Seq, p.Name, p.Kind, p.Output, p.Error, p.Attempts}
}

// large reports whether the output goes to idem_run_payloads, when its partition exists.
func (p CheckpointParams) large() bool { return large(len(p.Output)) }

// StepCheckpoint writes a step's row only if the writer still holds the lease, in the same
// transaction as the step's own writes, and locks the run's row until COMMIT (the fence). When
// the fence fails, the statement fails (IsFenceError) and aborts the transaction, so it may be
// queued to go with COMMIT. An output over PayloadInlineMax bytes goes to the partition of
// idem_run_payloads for the day the run was created, in the same statement, when that partition
// exists; a smaller one is sent with the statement it always was.
func (st *Statements) StepCheckpoint(p CheckpointParams) Stmt {
	if p.large() {
		return Stmt{SQL: st.steps.checkpointLarge, Args: p.args()}
	}
	return Stmt{SQL: st.steps.checkpoint, Args: p.args()}
}

// StepCheckpointInFenced writes a step's row without a fence of its own, for a transaction in
// which another statement fences (StepCheckpoint, RunFinish, WaitLock): one row lock on the run
// per transaction is enough to make a takeover wait for it. A large output goes as
// StepCheckpoint's does, to the partition of the day of p.Created.
func (st *Statements) StepCheckpointInFenced(p CheckpointParams) Stmt {
	if p.large() {
		return Stmt{SQL: st.steps.checkpointInFencedLarge, Args: append(p.args(), p.Created)}
	}
	return Stmt{SQL: st.steps.checkpointInFenced, Args: p.args()}
}

// IsFenceError reports whether err is StepCheckpoint's failed fence: the writer no longer holds
// the run's lease, or the run is no longer running.
func IsFenceError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23502" && pgErr.TableName == "idem_steps" && pgErr.ColumnName == "scope"
}

// StepRecord is a completed step as the history holds it.
type StepRecord struct {
	Seq        int
	Name, Kind string
	Output     []byte
	Error      *string
	Attempts   int
}

// RunHistory reads a run's completed steps in order, with their outputs: the large ones from
// the run's partition of idem_run_payloads, in one more query, only when the run has any. A
// large output missing from there is an error (ErrPayloadMissing), never an empty output.
func (st *Statements) RunHistory(ctx context.Context, q Querier, scope, id string) ([]StepRecord, error) {
	rows, err := q.Query(ctx, st.steps.history, scope, id)
	if err != nil {
		return nil, err
	}
	var (
		s   StepRecord
		day *time.Time
		out []StepRecord
		big []int // positions in out of the steps whose output is large
		lg  []time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&s.Seq, &s.Name, &s.Kind, &s.Output, &day, &s.Error, &s.Attempts}, func() error {
		if day != nil && s.Output == nil {
			big, lg = append(big, len(out)), append(lg, *day)
		}
		out = append(out, s)
		s.Output, s.Error, day = nil, nil, nil
		return nil
	})
	if err != nil || len(big) == 0 {
		return out, err
	}
	refs := make([]largeRef, len(big))
	for i, at := range big {
		refs[i] = largeRef{day: lg[i], ref: seqRef(out[at].Seq), dst: &out[at].Output}
	}
	if err := st.loadRunPayloads(ctx, q, scope, id, payloadStep, refs); err != nil {
		return nil, err
	}
	return out, nil
}

// AttemptOutcome says how a failed attempt of a step ended.
type AttemptOutcome string

// How a failed attempt ended: it was retried, it was the last one (the step failed for good
// after it), its error was marked permanent (no retry), or the run stopped during it (a lost
// connection, a lost lease, a shutdown), so the step runs again when the run resumes.
const (
	AttemptRetried   AttemptOutcome = "retried"
	AttemptFailed    AttemptOutcome = "failed"
	AttemptPermanent AttemptOutcome = "permanent"
	AttemptStopped   AttemptOutcome = "stopped"
)

// AttemptParams are a failed attempt of a step, and how many attempts of the step to keep.
type AttemptParams struct {
	LeaseParams
	Seq        int
	Name, Kind string
	Attempt    int
	Outcome    AttemptOutcome
	Error      string
	Keep       int    // the newest Keep attempts of the step are kept; at least 1
	Version    string // the code version the attempt ran on
}

// StepAttempt records a failed attempt of a step, if the writer holds the run's lease, and
// deletes the step's attempts beyond the newest Keep.
func (st *Statements) StepAttempt(p AttemptParams) Stmt {
	return Stmt{SQL: st.steps.attempt, Args: []any{p.Scope, p.ID, p.Token, p.Seq, p.Name, p.Kind, p.Attempt, string(p.Outcome), p.Error,
		max(p.Keep, 1), p.Version}}
}

// AttemptRow is a failed attempt of a step, as stored.
type AttemptRow struct {
	Seq        int
	Name, Kind string
	Attempt    int
	Outcome    AttemptOutcome
	Error      string
	At         time.Time
	Version    string
}

// RunAttempts reads a run's recorded failed attempts, oldest first.
func (st *Statements) RunAttempts(ctx context.Context, q Querier, scope, id string) ([]AttemptRow, error) {
	rows, err := q.Query(ctx, st.steps.attempts, scope, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AttemptRow, error) {
		var a AttemptRow
		err := r.Scan(&a.Seq, &a.Name, &a.Kind, &a.Attempt, &a.Outcome, &a.Error, &a.At, &a.Version)
		return a, err
	})
}

// Exec runs s on q, for a statement the caller sends on its own after all.
func (s Stmt) Exec(ctx context.Context, q Querier) (pgconn.CommandTag, error) {
	return q.Exec(ctx, s.SQL, s.Args...)
}
