package workflow

import (
	"context"
	"errors"
	"fmt"
)

// patchKind is the kind of a patch marker in a run's history.
const patchKind = "patch"

// Patched reports whether the run under ctx takes the branch of change id: true for a run that
// reaches this point on code that has the patch, false for a run that had passed this point
// before the patch was deployed. It is how a deploy changes the steps of a workflow that has runs
// in progress, without breaking them:
//
//	ok, err := workflow.Patched(ctx, "fraud-check")
//	if err != nil {
//		return Receipt{}, err
//	}
//	if ok { // new runs, and runs that had not got here yet
//		if _, err := steps.Call(ctx, "fraud-check", checkFraud, nil); err != nil {
//			return Receipt{}, err
//		}
//	}
//	charge, err := steps.Call(ctx, "charge", chargeCard, nil) // every run
//
// The answer is recorded in the run's history as a marker (a step of kind "patch", named id),
// so that every later replay of the run takes the same branch: a run that gets here past the end
// of its history records the marker (with its next transaction, at no extra round trip) and gets
// true; a replayed run whose history has the marker here gets true; a replayed run whose history
// has another step here (it passed this point before the patch existed) gets false, and the
// marker takes no position in its history.
//
// Changing code under running runs takes three deploys:
//
//  1. Add the patch: the new code behind `if Patched(ctx, id)`, the old code in its else branch.
//  2. Once no run that started before deploy 1 is left (idem runs list --version with the old
//     versions and the unfinished states shows none), keep only the new code, and replace the
//     Patched call with Deprecated(ctx, id): runs that recorded the marker still find it.
//  3. Once no run that recorded the marker is left, remove Deprecated.
//
// id names one point of the workflow: an empty id, or an id used twice in one run (by Patched or
// Deprecated), is an error at that call. Outside a workflow, Patched returns an error too.
func Patched(ctx context.Context, id string) (bool, error) {
	rs, seq, err := rs4patch(ctx, "Patched", id)
	if err != nil {
		return false, err
	}
	defer rs.mu.Unlock()
	if rec, ok := rs.history.at(seq); ok {
		if rec.Kind != patchKind || rec.Name != id {
			return false, nil // the run passed here before the patch: the old branch, no position
		}
		rs.next++
		return true, nil
	}
	if err := rs.pastHistory(); err != nil {
		return false, err
	}
	rs.next++
	rs.tx.queue(rs.checkpointParams(&StepInfo{Kind: patchKind, Name: id, Seq: seq, Attempt: 1}, []byte("true"), nil))
	return true, nil
}

// Deprecated marks the point where Patched(ctx, id) was once called, after every run that took
// the old branch is gone (step 2 of the three deploys described at [Patched]): a replayed run
// whose history has the marker of id here consumes it, so that its later steps stay where they
// were; any other run records nothing. Remove it once no run with the marker is left.
//
//	if err := workflow.Deprecated(ctx, "fraud-check"); err != nil {
//		return Receipt{}, err
//	}
//	if _, err := steps.Call(ctx, "fraud-check", checkFraud, nil); err != nil { // every run now
//		return Receipt{}, err
//	}
//
// An empty id, or one used twice in one run, is an error, as for Patched.
func Deprecated(ctx context.Context, id string) error {
	rs, seq, err := rs4patch(ctx, "Deprecated", id)
	if err != nil {
		return err
	}
	defer rs.mu.Unlock()
	if rec, ok := rs.history.at(seq); ok && rec.Kind == patchKind && rec.Name == id {
		rs.next++
	}
	return nil
}

// rs4patch checks a patch call and returns the run with rs.mu held (on success only) and the
// position the call is at.
func rs4patch(ctx context.Context, fn, id string) (*runState, int, error) {
	rs, ok := runFrom(ctx)
	switch {
	case !ok:
		return nil, 0, fmt.Errorf("workflow: %s(%q) was called outside a workflow: ctx must be (or derive from) the context a workflow function receives", fn, id)
	case id == "":
		return nil, 0, fmt.Errorf("workflow: %s needs a change id naming the change (such as \"fraud-check\"); id is empty", fn)
	case len(id) > 255:
		return nil, 0, fmt.Errorf("workflow: %s's change id must be 1 to 255 bytes (got %d)", fn, len(id))
	}
	if cause := context.Cause(ctx); cause != nil {
		return nil, 0, rs.stop(cause)
	}
	if err := rs.inBranch(ctx, fmt.Sprintf("%s(%q)", fn, id)); err != nil {
		return nil, 0, err
	}
	rs.mu.Lock()
	if rs.end != nil {
		defer rs.mu.Unlock()
		return nil, 0, rs.end.err
	}
	if rs.busy != "" {
		busy := rs.busy
		rs.mu.Unlock()
		return nil, 0, rs.stop(&machineryError{fmt.Errorf("workflow: %s(%q) was called while step %q is running; a run's steps and patches must be called one at a time", fn, id, busy)})
	}
	seq := rs.next
	if first, dup := rs.patches[id]; dup {
		rs.mu.Unlock()
		return nil, 0, fmt.Errorf("workflow: change id %q is used twice in one run, at step #%d and again at step #%d; each Patched or Deprecated point needs an id of its own", id, first, seq)
	}
	if rs.patches == nil {
		rs.patches = map[string]int{}
	}
	rs.patches[id] = seq
	return rs, seq, nil
}

// errReplayed ends a replay (see replay.go) where the run goes past its history: from there on
// the code would run new steps, which a replay never does.
var errReplayed = errors.New("workflow: the replay reached the end of the run's history")

// pastHistory is what a step or patch past the end of the run's history does in a replay: it ends
// the replay, which found no divergence up to there. nil for a real execution, which runs it.
// The caller holds rs.mu.
func (rs *runState) pastHistory() error {
	if !rs.replayOnly {
		return nil
	}
	if rs.end == nil {
		rs.end = &ending{kind: endReplayed, err: errReplayed}
	}
	if rs.cancel != nil {
		rs.cancel(rs.end.err)
	}
	return rs.end.err
}
