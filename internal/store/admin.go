package store

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// keyAdminStatements are the texts of the operator's statements on keys of idem.Do: reading,
// listing and forgetting them.
type keyAdminStatements struct {
	get, lock, delete, list string
}

// keyInfoColumns are what KeyRecord holds beside the key, read by scanKeyRecord. A run's key
// expires 'infinity'; it is read as NULL so that it scans into a *time.Time.
func keyInfoColumns(t Tables) string {
	return `k.fingerprint, coalesce(octet_length(k.result), ` + resultSize(t, "k") + `),
	k.workflow, k.created_at,
	CASE WHEN k.expires_at = 'infinity' THEN NULL ELSE k.expires_at END, k.expires_at > now(), r.state`
}

const keyInfoFrom = `FROM {keys} k LEFT JOIN {runs} r ON r.scope = k.scope AND r.id = k.id`

func newKeyAdminStatements(t Tables) keyAdminStatements {
	return keyAdminStatements{
		get: t.render(`SELECT ` + keyInfoColumns(t) + `
` + keyInfoFrom + `
WHERE k.scope = $1 AND k.id = $2`),
		lock:   `SELECT pg_try_advisory_xact_lock($1)`,
		delete: t.render(`DELETE FROM {keys} WHERE scope = $1 AND id = $2 AND workflow IS NULL`),

		// Keyset paging on the primary key (scope, id), whose COLLATE "C" orders ids by their
		// bytes: the prefix is the range [$3, $4), and the cursor a lower bound beside it; the
		// index's scan starts at the greater of the two and stops at $4 or the limit.
		list: t.render(`SELECT k.id, ` + keyInfoColumns(t) + `
` + keyInfoFrom + `
WHERE k.scope = $1 AND k.id > $2 AND k.id >= $3 AND k.id < $4
ORDER BY k.id LIMIT $5`),
	}
}

// KeyRecord is a key as an operator reads it: what is stored under it, without the result.
type KeyRecord struct {
	Scope, ID   string
	Fingerprint []byte
	ResultSize  int     // bytes of Do's stored result; 0 for none
	Workflow    *string // the run's workflow, nil for a key of idem.Do
	Created     time.Time
	Expires     *time.Time // nil for a run's key: its run decides
	Live        bool       // not expired, by Postgres's clock
	RunState    *RunState  // the state of the key's run, nil when it has none
}

func scanKeyRecord(dest []any, k *KeyRecord, size **int32) []any {
	return append(dest, &k.Fingerprint, size, &k.Workflow, &k.Created, &k.Expires, &k.Live, &k.RunState)
}

// KeyGet reads a key of idem.Do's or of a run, without side effects. ok is false when there is
// none.
func (st *Statements) KeyGet(ctx context.Context, q Querier, scope, id string) (KeyRecord, bool, error) {
	k := KeyRecord{Scope: scope, ID: id}
	var size *int32
	err := q.QueryRow(ctx, st.keyAdmin.get, scope, id).Scan(scanKeyRecord(nil, &k, &size)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return KeyRecord{}, false, nil
	}
	if size != nil {
		k.ResultSize = int(*size)
	}
	return k, err == nil, err
}

// KeyTryLock takes a key's in-flight lock (lock, its LockID) for the rest of the caller's
// transaction, without waiting, as idem.Do takes it; ok is false when another transaction holds
// it.
func (st *Statements) KeyTryLock(ctx context.Context, q Querier, lock int64) (ok bool, err error) {
	err = q.QueryRow(ctx, st.keyAdmin.lock, lock).Scan(&ok)
	return ok, err
}

// KeyDelete deletes a key of idem.Do's; a run's key is left alone. deleted is false when there
// was no such key of Do's.
func (st *Statements) KeyDelete(ctx context.Context, q Querier, scope, id string) (deleted bool, err error) {
	tag, err := q.Exec(ctx, st.keyAdmin.delete, scope, id)
	return tag.RowsAffected() > 0, err
}

// KeyListParams select a page of a scope's keys for KeyList: the ids that start with Prefix ("" for
// all), after the id After ("" to start from the first), at most Limit of them.
type KeyListParams struct {
	Scope, Prefix, After string
	Limit                int
}

// KeyList lists a scope's keys in the byte order of their ids, expired ones included.
func (st *Statements) KeyList(ctx context.Context, q Querier, p KeyListParams) ([]KeyRecord, error) {
	rows, err := q.Query(ctx, st.keyAdmin.list, p.Scope, p.After, p.Prefix, prefixEnd(p.Prefix), p.Limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (KeyRecord, error) {
		k := KeyRecord{Scope: p.Scope}
		var size *int32
		err := r.Scan(scanKeyRecord([]any{&k.ID}, &k, &size)...)
		if size != nil {
			k.ResultSize = int(*size)
		}
		return k, err
	})
}

// prefixEnd is the least string above every id that starts with prefix, in byte order. Ids are
// printable ASCII (0x21-0x7E), so the byte after the last of prefix is still one byte of valid
// UTF-8, and "\x7f" is above every id.
func prefixEnd(prefix string) string {
	if prefix == "" {
		return "\x7f"
	}
	return prefix[:len(prefix)-1] + string(rune(prefix[len(prefix)-1]+1))
}

// adminStatements are the texts of the operator's statements on runs: reading them without side
// effects, and the admin operations (cancel, resume, fork), each meant for one transaction.
type adminStatements struct {
	keyWorkflow, runGet, runSteps, runLock, runCancel, runCutFailed, runReopen, forkSource, forkSteps,
	forkEvents, forkCounts, cancelHeard string
}

// runColumns are what RunRecord holds, read by scanRunRecord.
const runColumns = `r.scope, r.id, r.workflow, r.state, r.attempts, coalesce(r.lease_owner, ''), r.lease_expires_at,
	coalesce(r.last_error, ''), r.input, r.output, r.created_at, r.updated_at, r.finished_at, r.expires_at,
	CASE WHEN r.state IN ('sleeping', 'awaiting') THEN r.wake_at END,
	CASE WHEN r.state = 'awaiting' THEN coalesce(r.wait_name, '') ELSE '' END, r.deadline,
	(SELECT count(*) FROM {signals} s WHERE s.scope = r.scope AND s.id = r.id AND s.consumed_at IS NULL)::int4,
	r.parent_scope, r.parent_id, r.parent_seq, r.attributes, coalesce(r.version, ''), coalesce(r.attempt_version, r.version, ''),
	r.forked_scope, r.forked_id, r.forked_steps`

// forkedOutput is the output of the step s, inline or large.
const forkedOutput = `coalesce(s.output, (SELECT p.data FROM {run_payloads} p
	WHERE p.day = s.output_day AND p.scope = s.scope AND p.id = s.id AND p.kind = '` + payloadStep + `' AND p.ref = s.seq::text))`

func newAdminStatements(t Tables) adminStatements {
	return adminStatements{
		keyWorkflow: t.render(`SELECT workflow FROM {keys} WHERE scope = $1 AND id = $2`),

		runGet: t.render(`SELECT ` + runColumns + ` FROM {runs} r WHERE r.scope = $1 AND r.id = $2`),

		runSteps: t.render(`SELECT seq, name, kind, attempts, output, output_day, error, created_at FROM {steps}
WHERE scope = $1 AND id = $2 ORDER BY seq`),

		// A checkpoint being committed holds the row (its fence), so this waits for it, and a
		// checkpoint that comes after it sees what this transaction wrote.
		runLock: t.render(`SELECT state, workflow, coalesce(lease_expires_at > {now}, false), coalesce(lease_owner, '')
FROM {runs} WHERE scope = $1 AND id = $2 FOR UPDATE`),

		// The lease's token goes, so that the owner's next checkpoint or renewal fails its
		// fence; its owner and expiry stay: the owner may still be finishing a step until then,
		// and a resume must not start a second owner beside it.
		runCancel: t.render(`UPDATE {runs} SET state = 'cancelled', output = $3, lease_token = NULL,
	updated_at = {now}, finished_at = {now}, expires_at = {now} + $4::int8 @us
WHERE scope = $1 AND id = $2`),

		// A large output missing from its partition (dropped by hand) is read through the
		// partitioned table, with the day as a key, as forkedOutput is: a partition that is gone
		// has no row.
		forkCounts: t.render(`SELECT count(*)::int4, count(*) FILTER (WHERE s.seq < $3 AND s.output IS NULL AND s.output_day IS NOT NULL
	AND NOT EXISTS (SELECT FROM {run_payloads} p WHERE p.day = s.output_day AND p.scope = s.scope AND p.id = s.id
		AND p.kind = '` + payloadStep + `' AND p.ref = s.seq::text))::int4
FROM {steps} s WHERE s.scope = $1 AND s.id = $2`),

		cancelHeard: t.render(`UPDATE {runs} SET lease_owner = NULL, lease_expires_at = NULL
WHERE scope = $1 AND id = $2 AND state = 'cancelled' AND lease_token IS NULL AND lease_owner = $3`),

		runCutFailed: t.render(`WITH cut AS (
	SELECT min(seq) AS seq FROM {steps} WHERE scope = $1 AND id = $2 AND error IS NOT NULL
), deleted AS (
	DELETE FROM {steps} WHERE scope = $1 AND id = $2 AND seq >= (SELECT seq FROM cut) RETURNING seq
), unconsumed AS (
	UPDATE {signals} SET consumed_at = NULL, consumed_step = NULL
	WHERE scope = $1 AND id = $2 AND consumed_step >= (SELECT seq FROM cut)
), unwaited AS (
	UPDATE {runs} SET wait_seq = CASE WHEN wait_seq >= c.seq THEN NULL ELSE wait_seq END,
		wait_name = CASE WHEN wait_seq >= c.seq THEN NULL ELSE wait_name END,
		wake_at = CASE WHEN wait_seq >= c.seq THEN NULL ELSE wake_at END,
		forked_steps = CASE WHEN forked_steps >= c.seq THEN c.seq - 1 ELSE forked_steps END
	FROM cut c WHERE scope = $1 AND id = $2 AND (wait_seq >= c.seq OR forked_steps >= c.seq)
)
SELECT seq FROM deleted`),

		runReopen: t.render(`UPDATE {runs} SET state = 'running', output = NULL, attempts = 0, lease_token = NULL,
	lease_owner = NULL, lease_expires_at = {now}, last_error = NULL, updated_at = {now}, finished_at = NULL,
	expires_at = NULL
WHERE scope = $1 AND id = $2
RETURNING (extract(epoch FROM lease_expires_at) * 1000000)::int8`),

		forkSource: t.render(`SELECT workflow, fingerprint, input, coalesce(trace_context, ''),
	(extract(epoch FROM deadline - created_at) * 1000000)::int8, concurrency_key, coalesce(concurrency_limit, 0), attributes,
	coalesce(version, '')
FROM {runs} WHERE scope = $1 AND id = $2 FOR SHARE`),

		// The fork is a new run, with a start day of its own: a large output of the run it copies
		// goes to the partition of that day, as the run's own checkpoints put theirs (inline when
		// that partition does not exist). A fork is an operator's rare act, so the payload is read
		// through the partitioned table, with its day as a key. The new run records where it
		// came from and how many steps it copied.
		forkSteps: t.render(`WITH origin AS (
	UPDATE {runs} SET forked_scope = $1, forked_id = $2, forked_steps = $5::int4 - 1 WHERE scope = $3 AND id = $4
	RETURNING ` + t.runPayloadDay("created_at") + ` AS day
), src AS (
	SELECT s.seq, s.name, s.kind, o.output, s.error, s.attempts, s.created_at,
		octet_length(o.output) > ` + strconv.Itoa(PayloadInlineMax) + ` AS large
	FROM {steps} s, LATERAL (SELECT ` + forkedOutput + ` AS output) o WHERE s.scope = $1 AND s.id = $2 AND s.seq < $5
), big AS (
	SELECT src.seq, src.output, origin.day FROM src, origin WHERE src.large
), stored AS (
	` + t.runPayloadStore(payloadStep, "big.day", "$3", "$4", "big.seq::text", "big.output", "big") + `
)
INSERT INTO {steps} (scope, id, seq, name, kind, output, output_day, error, attempts, created_at)
SELECT $3, $4, src.seq, src.name, src.kind, CASE WHEN src.large AND origin.day IS NOT NULL THEN NULL ELSE src.output END,
	CASE WHEN src.large THEN origin.day END, src.error, src.attempts, src.created_at
FROM src LEFT JOIN origin ON true`),

		// An event step's output is the value it set; the last of each name before the fork
		// point is what the run had published there. A large one goes to the new run's partition.
		forkEvents: t.render(`WITH origin AS (
	SELECT ` + t.runPayloadDay("created_at") + ` AS day FROM {runs} WHERE scope = $3 AND id = $4
), src AS (
	SELECT DISTINCT ON (name) name, ` + forkedOutput + ` AS value FROM {steps} s
	WHERE scope = $1 AND id = $2 AND seq < $5 AND kind = 'event' AND error IS NULL
	ORDER BY name, seq DESC
), big AS (
	SELECT src.name, src.value, origin.day FROM src, origin WHERE octet_length(src.value) > ` + strconv.Itoa(PayloadInlineMax) + `
), stored AS (
	` + t.runPayloadStore(payloadEvent, "big.day", "$3", "$4", "big.name", "big.value", "big") + `
)
INSERT INTO {events} (scope, id, name, value, value_day)
SELECT $3, $4, src.name, CASE WHEN big.day IS NULL THEN src.value END, big.day
FROM src LEFT JOIN big ON big.name = src.name`),
	}
}

// KeyWorkflow reads the workflow a key belongs to: nil for a key of Do's; ok is false when the
// key does not exist.
func (st *Statements) KeyWorkflow(ctx context.Context, q Querier, scope, id string) (workflow *string, ok bool, err error) {
	err = q.QueryRow(ctx, st.admin.keyWorkflow, scope, id).Scan(&workflow)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return workflow, err == nil, err
}

// RunRecord is a run as stored, for operators.
type RunRecord struct {
	Scope, ID, Workflow string
	State               RunState
	Attempts            int
	LeaseOwner          string
	LeaseExpires        *time.Time
	LastError           string
	Input, Output       []byte
	Created, Updated    time.Time
	Finished, Expires   *time.Time
	WakeAt              *time.Time
	AwaitingSignal      string
	Deadline            *time.Time
	PendingSignals      int
	ParentScope         *string // set for a child run
	ParentID            *string
	ParentSeq           *int
	Attributes          map[string]string
	Version             string  // the code version that started the run
	AttemptVersion      string  // the code version that took the run over or woke it last; else the start's
	ForkedScope         *string // set for a run made by RunFork: the run it copied
	ForkedID            *string
	ForkedSteps         *int // how many of that run's steps it copied
}

func scanRunRecord(r pgx.Row) (*RunRecord, error) {
	run := &RunRecord{}
	err := r.Scan(&run.Scope, &run.ID, &run.Workflow, &run.State, &run.Attempts, &run.LeaseOwner, &run.LeaseExpires,
		&run.LastError, &run.Input, &run.Output, &run.Created, &run.Updated, &run.Finished, &run.Expires, &run.WakeAt,
		&run.AwaitingSignal, &run.Deadline, &run.PendingSignals, &run.ParentScope, &run.ParentID, &run.ParentSeq, &run.Attributes,
		&run.Version, &run.AttemptVersion, &run.ForkedScope, &run.ForkedID, &run.ForkedSteps)
	if err != nil {
		return nil, err
	}
	return run, nil
}

// RunGet reads a run. ok is false when there is none.
func (st *Statements) RunGet(ctx context.Context, q Querier, scope, id string) (*RunRecord, bool, error) {
	run, err := scanRunRecord(q.QueryRow(ctx, st.admin.runGet, scope, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return run, err == nil, err
}

// StepRow is a completed step as an operator reads it.
type StepRow struct {
	Seq        int
	Name, Kind string
	Attempts   int
	Output     []byte
	Error      *string
	Created    time.Time
}

// RunSteps reads a run's completed steps in order, with their outputs: the large ones from the
// run's partition of idem_run_payloads, in one more query when it has any.
func (st *Statements) RunSteps(ctx context.Context, q Querier, scope, id string) ([]StepRow, error) {
	rows, err := q.Query(ctx, st.admin.runSteps, scope, id)
	if err != nil {
		return nil, err
	}
	var days []*time.Time
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StepRow, error) {
		var s StepRow
		var day *time.Time
		err := r.Scan(&s.Seq, &s.Name, &s.Kind, &s.Attempts, &s.Output, &day, &s.Error, &s.Created)
		days = append(days, day)
		return s, err
	})
	if err != nil {
		return nil, err
	}
	var refs []largeRef
	for i, day := range days {
		if day != nil && out[i].Output == nil {
			refs = append(refs, largeRef{day: *day, ref: seqRef(out[i].Seq), dst: &out[i].Output})
		}
	}
	if err := st.loadRunPayloads(ctx, q, scope, id, payloadStep, refs); err != nil {
		return nil, err
	}
	return out, nil
}

// LockedRun is a run's row as an admin operation locked it.
type LockedRun struct {
	State     RunState
	Workflow  string
	LeaseLive bool
	Owner     string
}

// RunLock reads a run's state and locks its row for the rest of the caller's transaction. ok is
// false when there is no run.
func (st *Statements) RunLock(ctx context.Context, q Querier, scope, id string) (LockedRun, bool, error) {
	var r LockedRun
	err := q.QueryRow(ctx, st.admin.runLock, scope, id).Scan(&r.State, &r.Workflow, &r.LeaseLive, &r.Owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return LockedRun{}, false, nil
	}
	return r, err == nil, err
}

// RunCancel finishes a run as cancelled with output, kept for ttl; see the statement for what
// it does to the lease.
func (st *Statements) RunCancel(ctx context.Context, q Querier, scope, id string, output []byte, ttl time.Duration) error {
	_, err := q.Exec(ctx, st.admin.runCancel, scope, id, output, micros(ttl))
	return err
}

// RunCutFailed deletes a run's steps from its first failed one on, so that a resume runs the
// failed step again, and undoes what those steps did to the run's waiting: signals they consumed
// are pending again, and a wait they left behind is forgotten (its timeout with it). It returns
// the positions of the steps it deleted.
func (st *Statements) RunCutFailed(ctx context.Context, q Querier, scope, id string) ([]int, error) {
	rows, err := q.Query(ctx, st.admin.runCutFailed, scope, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// RunReopen makes a run running again, with no owner, a lease that is already over and a fresh
// budget of attempts, so that the resume job inserted beside it takes it at once. It returns the
// lease's expiry in µs, the generation of the resume job.
func (st *Statements) RunReopen(ctx context.Context, q Querier, scope, id string) (generation int64, err error) {
	err = q.QueryRow(ctx, st.admin.runReopen, scope, id).Scan(&generation)
	return generation, err
}

// ForkSource is what a fork copies of a run.
type ForkSource struct {
	Workflow    string
	Fingerprint []byte
	Input       []byte
	Trace       string
	Timeout     time.Duration // the run's deadline less its creation; 0 for none
	Concurrency *Concurrency  // the run's concurrency key and limit; nil for none
	Attributes  map[string]string
	Version     string // the code version that started the run
}

// RunForkSource reads what a fork copies, locking the run against a concurrent change of its
// history (FOR SHARE). ok is false when there is no run.
func (st *Statements) RunForkSource(ctx context.Context, q Querier, scope, id string) (ForkSource, bool, error) {
	var f ForkSource
	var timeout *int64
	var key *string
	var limit int
	err := q.QueryRow(ctx, st.admin.forkSource, scope, id).Scan(&f.Workflow, &f.Fingerprint, &f.Input, &f.Trace, &timeout, &key, &limit,
		&f.Attributes, &f.Version)
	if errors.Is(err, pgx.ErrNoRows) {
		return ForkSource{}, false, nil
	}
	if timeout != nil {
		f.Timeout = time.Duration(*timeout) * time.Microsecond
	}
	if key != nil {
		f.Concurrency = &Concurrency{Key: *key, Limit: limit}
	}
	return f, err == nil, err
}

// RunForkSteps copies the steps before position from of one run to another, their large
// outputs into the partition of the new run's start day, and records in the new run which run
// it copied, and how many steps.
func (st *Statements) RunForkSteps(ctx context.Context, q Querier, scope, id, newScope, newID string, from int) error {
	_, err := q.Exec(ctx, st.admin.forkSteps, scope, id, newScope, newID, from)
	return err
}

// RunForkEvents gives a forked run the events that the steps before position from of the run it
// copies set: for each name, the value of the last of them. Step outputs of event steps are
// their values (see workflow.SetEventStep).
func (st *Statements) RunForkEvents(ctx context.Context, q Querier, scope, id, newScope, newID string, from int) error {
	_, err := q.Exec(ctx, st.admin.forkEvents, scope, id, newScope, newID, from)
	return err
}

// RunForkCounts counts a run's completed steps, and those before position from whose large output
// is not in its partition of idem_run_payloads (dropped by hand): a fork must not copy them as
// empty outputs.
func (st *Statements) RunForkCounts(ctx context.Context, q Querier, scope, id string, from int) (steps, missing int, err error) {
	err = q.QueryRow(ctx, st.admin.forkCounts, scope, id, from).Scan(&steps, &missing)
	return steps, missing, err
}

// RunCancelHeard is the cancelled owner saying it has stopped: the lease it kept (see RunCancel)
// is given up, so that a resume need not wait for it to run out.
func (st *Statements) RunCancelHeard(ctx context.Context, q Querier, scope, id, owner string) error {
	_, err := q.Exec(ctx, st.admin.cancelHeard, scope, id, owner)
	return err
}

// RunFilter selects runs for RunList. Zero fields select everything (a zero Limit: every run).
type RunFilter struct {
	States     []string
	Workflows  []string
	Versions   []string // started by any of these code versions
	Scope      string
	Since      *time.Time        // created at or after
	Until      *time.Time        // created before
	Parent     *RunKey           // children of this run (Workflow unused)
	Attributes map[string]string // having each of these attributes (key and value)
	After      *RunCursor
	Limit      int
}

// RunCursor is the position after which a page of RunList starts: the last run of the page
// before. (created_at, scope, id) is unique and ordered, so a page never repeats or skips a run
// that existed when the first page was read, however many runs are added meanwhile.
type RunCursor struct {
	Created   int64 // µs since the epoch
	Scope, ID string
}

// RunList lists runs, newest first. Only the filters that are set are in the statement's text,
// so that the planner sees plain predicates that idem_runs' indexes serve: idem_runs_created for
// the order and the cursor, idem_runs_state and idem_runs_workflow when filtering by them (a
// version's unfinished runs through their states), and idem_runs_attributes for attributes.
func (st *Statements) RunList(ctx context.Context, q Querier, f RunFilter) ([]*RunRecord, error) {
	sql, args := st.listRuns(f)
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*RunRecord, error) { return scanRunRecord(r) })
}

func (st *Statements) listRuns(f RunFilter) (string, []any) {
	var (
		where []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if len(f.States) > 0 {
		where = append(where, "r.state = ANY("+arg(f.States)+"::text[])")
	}
	if len(f.Workflows) > 0 {
		where = append(where, "r.workflow = ANY("+arg(f.Workflows)+"::text[])")
	}
	if len(f.Versions) > 0 {
		where = append(where, "r.version = ANY("+arg(f.Versions)+"::text[])")
	}
	if f.Scope != "" {
		where = append(where, "r.scope = "+arg(f.Scope))
	}
	if f.Since != nil {
		where = append(where, "r.created_at >= "+arg(*f.Since))
	}
	if f.Until != nil {
		where = append(where, "r.created_at < "+arg(*f.Until))
	}
	if f.Parent != nil {
		where = append(where, "r.parent_scope = "+arg(f.Parent.Scope)+" AND r.parent_id = "+arg(f.Parent.ID))
	}
	if len(f.Attributes) > 0 {
		// Containment, which idem_runs_attributes (GIN, partial on NOT NULL) serves.
		where = append(where, "r.attributes @> "+arg(attributesArg(f.Attributes))+"::jsonb")
	}
	if c := f.After; c != nil {
		where = append(where, "(r.created_at, r.scope, r.id) < ('epoch'::timestamptz + "+arg(c.Created)+"::int8 * interval '1 microsecond', "+
			arg(c.Scope)+", "+arg(c.ID)+")")
	}
	sql := st.Tables.render("SELECT " + runColumns + "\nFROM {runs} r")
	if len(where) > 0 {
		sql += "\nWHERE " + strings.Join(where, " AND ")
	}
	sql += "\nORDER BY r.created_at DESC, r.scope DESC, r.id DESC"
	if f.Limit > 0 {
		sql += " LIMIT " + arg(f.Limit)
	}
	return sql, args
}
