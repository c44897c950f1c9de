package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/store"
)

// enqueueChild starts a child of parent/pid at step seq with RunEnqueue, as StartChild does.
func (b *testBundle) enqueueChild(t *testing.T, q store.Querier, id, parent string, seq int, close string) {
	t.Helper()
	_, ok, err := b.st.RunEnqueue(b.ctx, q, store.RunEnqueueParams{Scope: "s", ID: id, Workflow: "child", Input: []byte(`1`),
		Parent: &store.ParentRef{Scope: "s", ID: parent, Seq: seq, Close: close}})
	require.NoError(t, err)
	require.True(t, ok)
}

func TestRunEnqueueParent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "p"})
	b.enqueueChild(t, b.pool, "c", "p", 2, store.ParentCancel)
	rec, ok, err := b.st.RunGet(b.ctx, b.pool, "s", "c")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "s", *rec.ParentScope)
	require.Equal(t, "p", *rec.ParentID)
	require.Equal(t, 2, *rec.ParentSeq)
	var closeRule string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT parent_close FROM idem_runs WHERE id = 'c'`).Scan(&closeRule))
	require.Equal(t, store.ParentCancel, closeRule)

	t.Run("LockHeldElsewhere", func(t *testing.T) {
		// A start of the same key in flight holds its lock: the enqueue answers at once.
		other := b.begin(t)
		_, err := other.Exec(b.ctx, `SELECT pg_advisory_xact_lock($1)`, store.LockID("", "s", "busy"))
		require.NoError(t, err)
		_, ok, err := b.st.RunEnqueue(b.ctx, b.lockedElsewhere(t), store.RunEnqueueParams{Scope: "s", ID: "busy", Workflow: "child"})
		require.NoError(t, err)
		require.False(t, ok)
	})
}

func TestRunParentLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "p", state: store.RunAwaiting, waitSeq: 3, waitName: store.ChildWaitPrefix + "c"})
	b.enqueueChild(t, b.pool, "c", "p", 1, store.ParentCancel)
	b.enqueueChild(t, b.pool, "other", "p", 2, store.ParentCancel)
	b.insertRun(t, run{scope: "s", id: "orphan"})

	tx := b.begin(t)
	p, ok, err := b.st.RunParentLock(b.ctx, tx, "s", "c")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "p", p.ID)
	require.Equal(t, 3, p.WaitSeq)
	require.True(t, p.Awaits, "the parent waits for this child")
	require.NotZero(t, p.Created)
	// The parent's row is held against a parent about to wait (FOR UPDATE), not against a
	// checkpoint (FOR NO KEY UPDATE would conflict too, but a renewal's UPDATE of a non-key column
	// takes FOR NO KEY UPDATE): a FOR UPDATE elsewhere must wait.
	_, err = b.lockedElsewhere(t).Exec(b.ctx, `SELECT FROM idem_runs WHERE id = 'p' FOR UPDATE`)
	require.True(t, isLockTimeout(err), "the parent is not held: %v", err)

	p, ok, err = b.st.RunParentLock(b.ctx, b.pool, "s", "other")
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, p.Awaits, "the parent waits for another child")

	_, ok, err = b.st.RunParentLock(b.ctx, b.pool, "s", "orphan")
	require.NoError(t, err)
	require.False(t, ok, "no parent")
}

func TestRunCancelChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "p"})
	b.enqueueChild(t, b.pool, "c1", "p", 1, store.ParentCancel)
	b.enqueueChild(t, b.pool, "c2", "p", 2, store.ParentAbandon)
	b.enqueueChild(t, b.pool, "g1", "c1", 1, store.ParentCancel) // a grandchild
	b.enqueueChild(t, b.pool, "g2", "c2", 1, store.ParentCancel) // under an abandoned child
	b.insertRun(t, run{scope: "s", id: "done-child", state: store.RunDone})
	_, err := b.pool.Exec(b.ctx, `UPDATE idem_runs SET parent_scope = 's', parent_id = 'p', parent_seq = 3, parent_close = 'cancel' WHERE id = 'done-child'`)
	require.NoError(t, err)

	cancelled, err := b.st.RunCancelChildren(b.ctx, b.pool, "s", "p", []byte(`{"error":"with its parent"}`), time.Hour)
	require.NoError(t, err)
	var ids []string
	for _, k := range cancelled {
		ids = append(ids, k.ID)
		require.Equal(t, "child", k.Workflow)
	}
	require.ElementsMatch(t, []string{"c1", "g1"}, ids, "children to cancel, and theirs; not the abandoned one's, nor a finished one")
	for id, want := range map[string]store.RunState{"c1": store.RunCancelled, "g1": store.RunCancelled, "c2": store.RunRunning,
		"g2": store.RunRunning, "done-child": store.RunDone} {
		require.Equal(t, want, b.stored(t, "s", id).State, id)
	}
	require.Equal(t, `{"error":"with its parent"}`, string(b.stored(t, "s", "c1").Output))
}

func TestRunChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "p"})
	b.enqueueChild(t, b.pool, "second", "p", 2, store.ParentCancel)
	b.enqueueChild(t, b.pool, "first", "p", 1, store.ParentCancel)
	children, err := b.st.RunChildren(b.ctx, b.pool, "s", "p")
	require.NoError(t, err)
	require.Len(t, children, 2)
	require.Equal(t, "first", children[0].ID, "in the order of the steps that started them")
	require.Equal(t, 1, children[0].Seq)
	require.Equal(t, "second", children[1].ID)
	require.Equal(t, store.RunRunning, children[1].State)

	list, err := b.st.RunList(b.ctx, b.pool, store.RunFilter{Parent: &store.RunKey{Scope: "s", ID: "p"}})
	require.NoError(t, err)
	require.Len(t, list, 2)
	none, err := b.st.RunChildren(b.ctx, b.pool, "s", "second")
	require.NoError(t, err)
	require.Empty(t, none)
}

func TestRunOverdueParents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertRun(t, run{scope: "s", id: "waits", state: store.RunAwaiting, waitSeq: 2, waitName: store.ChildWaitPrefix + "ended"})
	b.enqueueChild(t, b.pool, "ended", "waits", 1, store.ParentCancel)
	b.insertRun(t, run{scope: "s", id: "waits-on-live", state: store.RunAwaiting, waitSeq: 1, waitName: store.ChildWaitPrefix + "live"})
	b.enqueueChild(t, b.pool, "live", "waits-on-live", 1, store.ParentCancel)
	_, err := b.pool.Exec(b.ctx, `UPDATE idem_runs SET state = 'done', finished_at = now() - interval '1 minute', expires_at = now() + interval '1 hour' WHERE id = 'ended'`)
	require.NoError(t, err)

	parents, err := b.st.RunOverdueParents(b.ctx, b.pool, 10, 30*time.Second)
	require.NoError(t, err)
	require.Len(t, parents, 1)
	require.Equal(t, "waits", parents[0].ID)
	require.Equal(t, 2, parents[0].WaitSeq)
	parents, err = b.st.RunOverdueParents(b.ctx, b.pool, 10, 2*time.Minute)
	require.NoError(t, err)
	require.Empty(t, parents, "ended less than late ago: its own wake job has time yet")
}
