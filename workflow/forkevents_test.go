package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// TestRunForkEvents: a fork from step N has every event that its copied SetEvent steps set, with
// the value the last of them set, and none that only later steps set; the steps it runs again
// set theirs anew.
func TestRunForkEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var fail atomic.Bool
	fail.Store(true)
	wf := workflow.Define("publish", func(ctx context.Context, in int) (string, error) {
		for _, ev := range []struct {
			name  string
			value any
		}{{"status", "reserved"}, {"amount", in}, {"status", "charging"}, {"late", true}} {
			if err := steps.SetEvent(ctx, ev.name, ev.value); err != nil {
				return "", err
			}
		}
		return steps.Call(ctx, "charge", func(context.Context, string) (string, error) {
			if fail.Load() {
				return "", steps.Permanent(errors.New("declined"))
			}
			return "ok", nil
		}, nil)
	})
	e := b.engine(t, fastConfig(wf))
	key := idem.Key{Scope: "s", ID: "k"}
	_, err := wf.Run(b.ctx, e, key, 7, nil)
	require.ErrorIs(t, err, workflow.ErrFailed)
	e.SetClient(insertOnlyClient(t, b)) // the forks' resume jobs wait, unworked

	event := func(key idem.Key, name string) any {
		t.Helper()
		raw, err := e.EventGet(b.ctx, key, name, 0)
		if errors.Is(err, workflow.ErrEventNotSet) {
			return nil
		}
		require.NoError(t, err)
		var v any
		require.NoError(t, json.Unmarshal(raw, &v))
		return v
	}
	for from, want := range map[int]map[string]any{
		1: {"status": nil, "amount": nil, "late": nil},
		3: {"status": "reserved", "amount": 7.0, "late": nil},
		4: {"status": "charging", "amount": 7.0, "late": nil},
		5: {"status": "charging", "amount": 7.0, "late": true},
	} {
		forked := idem.Key{Scope: "s", ID: "fork-" + string(rune('0'+from))}
		require.NoError(t, e.RunFork(b.ctx, key, forked, from))
		for name, v := range want {
			require.Equal(t, v, event(forked, name), "fork from step %d, event %q", from, name)
		}
	}
	require.Equal(t, "charging", event(key, "status"), "the original keeps its events")

	// Worked, the fork from step 3 sets the later events again and finishes.
	fail.Store(false)
	b.startRiver(t, e)
	require.Equal(t, "done", b.waitFinished(t, idem.Key{Scope: "s", ID: "fork-3"}))
	require.Equal(t, "charging", event(idem.Key{Scope: "s", ID: "fork-3"}, "status"))
	require.Equal(t, true, event(idem.Key{Scope: "s", ID: "fork-3"}, "late"))
}
