package store

import (
	"strconv"
	"strings"
)

// AdminStatements are the operator's statements: reading keys and runs without side effects, and
// the admin operations (cancel, resume, fork, forgetting a key), each meant for one transaction.
// Arguments are listed as $n = name.
type AdminStatements struct {
	// KeyGet reads a key and, when it belongs to a run, the run's state. A run's key expires
	// 'infinity'; it is read as NULL so that it scans into a *time.Time. $1 scope, $2 id.
	KeyGet string

	// KeyLock takes the key's in-flight lock without waiting, as Do does. $1 lock id.
	KeyLock string

	// KeyDelete deletes a key of Do's. $1 scope, $2 id.
	KeyDelete string

	// KeyWorkflow reads the workflow a key belongs to, NULL for Do's. $1 scope, $2 id.
	KeyWorkflow string

	// RunGet reads a run. $1 scope, $2 id.
	RunGet string

	// RunSteps reads a run's steps in order. $1 scope, $2 id.
	RunSteps string

	// RunLock reads a run's state and locks its row for the rest of the transaction. A checkpoint
	// being committed holds the row (its fence), so this waits for it, and a checkpoint that comes
	// after it sees what this transaction wrote. $1 scope, $2 id.
	RunLock string

	// RunCancel finishes a run as cancelled. It takes the lease's token away, so that the
	// owner's next checkpoint or renewal fails its fence, and keeps the lease's owner and
	// expiry: the owner may still be finishing a step until then, and a resume must not start a
	// second owner beside it. $1 scope, $2 id, $3 output, $4 TTL µs.
	RunCancel string

	// RunCutFailed deletes a run's steps from its first failed one on, so that a resume runs the
	// failed step again, and undoes what those steps did to the run's waiting: signals they
	// consumed are pending again, and a wait they left behind is forgotten (its timeout with
	// it). $1 scope, $2 id. Returns the seq of each step deleted.
	RunCutFailed string

	// RunReopen makes a run running again, with no owner, a lease that is already over and a
	// fresh budget of attempts, so that the resume job inserted beside it takes it at once.
	// $1 scope, $2 id. Returns lease_expires_at in µs, the generation of the resume job.
	RunReopen string

	// RunForkSource reads what a fork copies, locking the run against a concurrent change of its
	// history. $1 scope, $2 id. Returns workflow, fingerprint, input, trace context and the
	// run's timeout in µs (its deadline less its creation; NULL for none).
	RunForkSource string

	// RunForkSteps copies the steps before a position to another run.
	// $1 scope, $2 id, $3 new scope, $4 new id, $5 from seq (not copied).
	RunForkSteps string

	// RunStepCount counts a run's completed steps. $1 scope, $2 id.
	RunStepCount string

	// RunCancelHeard is the cancelled owner saying it has stopped: the lease it kept (see
	// RunCancel) is given up, so that a resume need not wait for it to run out.
	// $1 scope, $2 id, $3 lease owner.
	RunCancelHeard string
}

const runColumns = `r.scope, r.id, r.workflow, r.state, r.attempts, coalesce(r.lease_owner, ''), r.lease_expires_at,
	coalesce(r.last_error, ''), r.input, r.output, r.created_at, r.updated_at, r.finished_at, r.expires_at,
	CASE WHEN r.state IN ('sleeping', 'awaiting') THEN r.wake_at END,
	CASE WHEN r.state = 'awaiting' THEN coalesce(r.wait_name, '') ELSE '' END, r.deadline,
	(SELECT count(*) FROM {signals} s WHERE s.scope = r.scope AND s.id = r.id AND s.consumed_at IS NULL)::int4`

func adminStatements(t Tables) AdminStatements {
	return AdminStatements{
		KeyGet: t.render(`SELECT k.fingerprint, octet_length(k.result), k.workflow, k.created_at,
	CASE WHEN k.expires_at = 'infinity' THEN NULL ELSE k.expires_at END, k.expires_at > now(), r.state
FROM {keys} k LEFT JOIN {runs} r ON r.scope = k.scope AND r.id = k.id
WHERE k.scope = $1 AND k.id = $2`),

		KeyLock: `SELECT pg_try_advisory_xact_lock($1)`,

		KeyDelete: t.render(`DELETE FROM {keys} WHERE scope = $1 AND id = $2 AND workflow IS NULL`),

		KeyWorkflow: t.render(`SELECT workflow FROM {keys} WHERE scope = $1 AND id = $2`),

		RunGet: t.render(`SELECT ` + runColumns + ` FROM {runs} r WHERE r.scope = $1 AND r.id = $2`),

		RunSteps: t.render(`SELECT seq, name, kind, attempts, output, error, created_at FROM {steps}
WHERE scope = $1 AND id = $2 ORDER BY seq`),

		RunLock: t.render(`SELECT state, workflow, coalesce(lease_expires_at > now(), false), coalesce(lease_owner, '')
FROM {runs} WHERE scope = $1 AND id = $2 FOR UPDATE`),

		RunCancel: t.render(`UPDATE {runs} SET state = 'cancelled', output = $3, lease_token = NULL,
	updated_at = now(), finished_at = now(), expires_at = now() + $4::int8 @us
WHERE scope = $1 AND id = $2`),

		RunStepCount: t.render(`SELECT count(*)::int4 FROM {steps} WHERE scope = $1 AND id = $2`),

		RunCancelHeard: t.render(`UPDATE {runs} SET lease_owner = NULL, lease_expires_at = NULL
WHERE scope = $1 AND id = $2 AND state = 'cancelled' AND lease_token IS NULL AND lease_owner = $3`),

		RunCutFailed: t.render(`WITH cut AS (
	SELECT min(seq) AS seq FROM {steps} WHERE scope = $1 AND id = $2 AND error IS NOT NULL
), deleted AS (
	DELETE FROM {steps} WHERE scope = $1 AND id = $2 AND seq >= (SELECT seq FROM cut) RETURNING seq
), unconsumed AS (
	UPDATE {signals} SET consumed_at = NULL, consumed_step = NULL
	WHERE scope = $1 AND id = $2 AND consumed_step >= (SELECT seq FROM cut)
), unwaited AS (
	UPDATE {runs} SET wait_seq = NULL, wait_name = NULL, wake_at = NULL
	WHERE scope = $1 AND id = $2 AND wait_seq >= (SELECT seq FROM cut)
)
SELECT seq FROM deleted`),

		RunReopen: t.render(`UPDATE {runs} SET state = 'running', output = NULL, attempts = 0, lease_token = NULL,
	lease_owner = NULL, lease_expires_at = now(), last_error = NULL, updated_at = now(), finished_at = NULL,
	expires_at = NULL
WHERE scope = $1 AND id = $2
RETURNING (extract(epoch FROM lease_expires_at) * 1000000)::int8`),

		RunForkSource: t.render(`SELECT workflow, fingerprint, input, trace_context,
	(extract(epoch FROM deadline - created_at) * 1000000)::int8
FROM {runs} WHERE scope = $1 AND id = $2 FOR SHARE`),

		RunForkSteps: t.render(`INSERT INTO {steps} (scope, id, seq, name, kind, output, error, attempts, created_at)
SELECT $3, $4, seq, name, kind, output, error, attempts, created_at FROM {steps}
WHERE scope = $1 AND id = $2 AND seq < $5`),
	}
}

// RunFilter selects runs for ListRuns. Zero fields select everything.
type RunFilter struct {
	States    []string
	Workflows []string
	Scope     string
	Since     *int64 // created at or after, µs since the epoch
	Until     *int64 // created before, µs since the epoch
	After     *RunCursor
	Limit     int
}

// RunCursor is the position after which a page of ListRuns starts: the last run of the page
// before. (created_at, scope, id) is unique and ordered, so a page never repeats or skips a run
// that existed when the first page was read, however many runs are added meanwhile.
type RunCursor struct {
	Created   int64 // µs since the epoch
	Scope, ID string
}

// ListRuns builds the statement that lists runs, newest first. Only the filters that are set
// are in its text, so that the planner sees plain predicates that idem_runs' indexes serve:
// idem_runs_created for the order and the cursor, idem_runs_state and idem_runs_workflow when
// filtering by them.
func (st *Statements) ListRuns(f RunFilter) (string, []any) {
	var (
		where []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	const at = "'epoch'::timestamptz + %s::int8 * interval '1 microsecond'"
	ts := func(us int64) string { return strings.Replace(at, "%s", arg(us), 1) }
	if len(f.States) > 0 {
		where = append(where, "r.state = ANY("+arg(f.States)+"::text[])")
	}
	if len(f.Workflows) > 0 {
		where = append(where, "r.workflow = ANY("+arg(f.Workflows)+"::text[])")
	}
	if f.Scope != "" {
		where = append(where, "r.scope = "+arg(f.Scope))
	}
	if f.Since != nil {
		where = append(where, "r.created_at >= "+ts(*f.Since))
	}
	if f.Until != nil {
		where = append(where, "r.created_at < "+ts(*f.Until))
	}
	if c := f.After; c != nil {
		where = append(where, "(r.created_at, r.scope, r.id) < ("+ts(c.Created)+", "+arg(c.Scope)+", "+arg(c.ID)+")")
	}
	sql := st.Tables.render("SELECT " + runColumns + "\nFROM {runs} r")
	if len(where) > 0 {
		sql += "\nWHERE " + strings.Join(where, " AND ")
	}
	sql += "\nORDER BY r.created_at DESC, r.scope DESC, r.id DESC LIMIT " + arg(f.Limit)
	return sql, args
}
