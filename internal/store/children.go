package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// ChildWaitPrefix starts the wait_name of a run that waits for a child: "child:" and the child's
// id (a child's scope is its parent's).
const ChildWaitPrefix = "child:"

// finishedStates is the SQL list of final states.
const finishedStates = `('done', 'failed', 'cancelled', 'timed_out')`

// childStatements are the texts of the statements for child runs.
type childStatements struct {
	parent, cancelChildren, children, overdue string
}

func newChildStatements(t Tables) childStatements {
	return childStatements{
		// The parent's row is locked FOR KEY SHARE whatever its state, so that a child that ends
		// and a parent about to wait for it (WaitLock, FOR UPDATE) are ordered: whichever comes
		// second sees the other's commit, and a parent never waits for a child that has ended.
		parent: t.render(`SELECT p.scope, p.id, (extract(epoch FROM p.created_at) * 1000000)::int8, coalesce(p.wait_seq, 0),
	(extract(epoch FROM p.updated_at) * 1000000)::int8, p.state = 'awaiting' AND p.wait_name = '` + ChildWaitPrefix + `' || $2
FROM {runs} p WHERE (p.scope, p.id) = (SELECT parent_scope, parent_id FROM {runs} WHERE scope = $1 AND id = $2)
FOR KEY SHARE`),

		cancelChildren: t.render(`WITH RECURSIVE tree(scope, id, state) AS (
	SELECT scope, id, state FROM {runs}
	WHERE parent_scope = $1 AND parent_id = $2 AND parent_close = 'cancel' AND state NOT IN ` + finishedStates + `
	UNION
	SELECT r.scope, r.id, r.state FROM {runs} r JOIN tree ON r.parent_scope = tree.scope AND r.parent_id = tree.id
	WHERE r.parent_close = 'cancel' AND r.state NOT IN ` + finishedStates + `
)
UPDATE {runs} r SET state = 'cancelled', output = $3, lease_token = NULL, updated_at = {now}, finished_at = {now},
	expires_at = {now} + $4::int8 @us
FROM tree WHERE r.scope = tree.scope AND r.id = tree.id
RETURNING r.scope, r.id, r.workflow, tree.state = 'queued'`),

		children: t.render(`SELECT scope, id, workflow, state, coalesce(parent_seq, 0), created_at FROM {runs}
WHERE parent_scope = $1 AND parent_id = $2 ORDER BY parent_seq, created_at, id`),

		overdue: t.render(`SELECT p.scope, p.id, (extract(epoch FROM p.created_at) * 1000000)::int8, coalesce(p.wait_seq, 0),
	(extract(epoch FROM p.updated_at) * 1000000)::int8
FROM {runs} p JOIN {runs} c ON c.parent_scope = p.scope AND c.parent_id = p.id AND p.wait_name = '` + ChildWaitPrefix + `' || c.id
WHERE p.state = 'awaiting' AND p.wait_name LIKE '` + ChildWaitPrefix + `%' AND c.state IN ` + finishedStates + `
	AND c.finished_at <= {now} - $2::int8 @us
LIMIT $1`),
	}
}

// ParentRow is a child's parent, as the child's end locked it.
type ParentRow struct {
	Scope, ID string
	Created   int64 // µs: the parent's generation
	WaitSeq   int   // the step it waits at, 0 for none
	Suspended int64 // µs: while it waits, when its wait began
	Awaits    bool  // it waits for this child now
}

// RunParentLock locks the parent of the run scope/id FOR KEY SHARE, whatever its state, and reads
// whether it waits for this run now: the statement of a child's final transaction, which wakes a
// waiting parent. ok is false when the run has no parent (or its parent is gone).
func (st *Statements) RunParentLock(ctx context.Context, q Querier, scope, id string) (ParentRow, bool, error) {
	var p ParentRow
	err := q.QueryRow(ctx, st.children.parent, scope, id).Scan(&p.Scope, &p.ID, &p.Created, &p.WaitSeq, &p.Suspended, &p.Awaits)
	if errors.Is(err, pgx.ErrNoRows) {
		return ParentRow{}, false, nil
	}
	return p, err == nil, err
}

// RunKey names a run.
type RunKey struct {
	Scope, ID, Workflow string
	WasQueued           bool // RunCancelChildren: it waited for a slot of its concurrency key
}

// RunCancelChildren cancels, with output kept for ttl, the unfinished children of the run
// scope/id whose parent's cancel cancels them (ParentCancel), and theirs, all the way down. As
// RunCancel, it takes each one's lease token away, so that a live owner stops at its next
// checkpoint. It returns the runs it cancelled.
func (st *Statements) RunCancelChildren(ctx context.Context, q Querier, scope, id string, output []byte, ttl time.Duration) ([]RunKey, error) {
	rows, err := q.Query(ctx, st.children.cancelChildren, scope, id, output, micros(ttl))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (RunKey, error) {
		var k RunKey
		err := r.Scan(&k.Scope, &k.ID, &k.Workflow, &k.WasQueued)
		return k, err
	})
}

// ChildRow is a child run as its parent's RunGet lists it.
type ChildRow struct {
	Scope, ID, Workflow string
	State               RunState
	Seq                 int // the parent's step that started it
	Created             time.Time
}

// RunChildren reads the children of the run scope/id, in the order its steps started them.
func (st *Statements) RunChildren(ctx context.Context, q Querier, scope, id string) ([]ChildRow, error) {
	rows, err := q.Query(ctx, st.children.children, scope, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ChildRow, error) {
		var c ChildRow
		err := r.Scan(&c.Scope, &c.ID, &c.Workflow, &c.State, &c.Seq, &c.Created)
		return c, err
	})
}

// RunOverdueParents finds up to limit runs that wait for a child which ended more than late ago:
// the job its end inserted to wake the parent was lost, or River is far behind.
func (st *Statements) RunOverdueParents(ctx context.Context, q Querier, limit int, late time.Duration) ([]ParentRow, error) {
	rows, err := q.Query(ctx, st.children.overdue, limit, micros(late))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParentRow, error) {
		p := ParentRow{Awaits: true}
		err := r.Scan(&p.Scope, &p.ID, &p.Created, &p.WaitSeq, &p.Suspended)
		return p, err
	})
}
