package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// fastRetries retry a step at once, so that the tests do not wait for backoff.
func fastRetries(n int) *steps.Opts {
	return &steps.Opts{MaxAttempts: n, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
}

// TestFailedAttemptsAreVisible checks that every failed attempt of a step keeps its error, its
// number, its time and how it ended, and that RunGet and the step's span show them: an operator
// can tell why a step ran three times.
func TestFailedAttemptsAreVisible(t *testing.T) {
	t.Parallel()
	k := idem.Key{Scope: "s", ID: "k"}

	t.Run("RetriedThenDone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		spans := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
		var calls atomic.Int32
		wf := workflow.Define("flaky", func(ctx context.Context, _ int) (int, error) {
			return steps.Call(ctx, "charge", func(context.Context, string) (int, error) {
				if n := calls.Add(1); n < 3 {
					return 0, fmt.Errorf("provider said 503 on call %d", n)
				}
				return 7, nil
			}, fastRetries(5))
		})
		cfg := fastConfig(wf)
		cfg.TracerProvider = tp
		e := b.engine(t, cfg)
		out, err := wf.Run(b.ctx, e, k, 1, nil)
		require.NoError(t, err)
		require.Equal(t, 7, out)

		run, err := e.RunGet(b.ctx, k)
		require.NoError(t, err)
		require.Len(t, run.Steps, 1)
		require.Equal(t, 3, run.Steps[0].Attempts)
		require.Len(t, run.Failures, 2)
		for i, a := range run.Failures {
			require.Equal(t, 1, a.Seq)
			require.Equal(t, "charge", a.Step)
			require.Equal(t, "call", a.Kind)
			require.Equal(t, i+1, a.Attempt)
			require.Equal(t, workflow.AttemptRetried, a.Outcome)
			require.Equal(t, fmt.Sprintf("provider said 503 on call %d", i+1), a.Error)
			require.WithinDuration(t, time.Now(), a.At, time.Minute)
		}
		require.True(t, run.Failures[0].At.Before(run.Failures[1].At))

		var events []string
		for _, s := range spans.GetSpans() {
			if s.Name != "idem.workflow.step" {
				continue
			}
			for _, ev := range s.Events {
				if ev.Name == "attempt failed" {
					for _, kv := range ev.Attributes {
						if kv.Key == "error" {
							events = append(events, kv.Value.AsString())
						}
					}
				}
			}
		}
		require.Equal(t, []string{"provider said 503 on call 1", "provider said 503 on call 2"}, events)
	})

	t.Run("TheFirstStepsFailedAttemptCommitsTheStart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var tries atomic.Int32
		wf := workflow.Define("first", func(ctx context.Context, _ int) (int, error) {
			return steps.Tx(ctx, "write", func(ctx context.Context, tx pgx.Tx) (int, error) {
				if err := effect(ctx, tx, "first", "write", ""); err != nil {
					return 0, err
				}
				if tries.Add(1) == 1 {
					return 0, errors.New("constraint says no, once")
				}
				return 1, nil
			}, fastRetries(3))
		})
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, k, 1, nil)
		require.NoError(t, err)
		require.Equal(t, 1, b.effects(t, "write"), "the failed attempt's write was undone, the start kept")
		run, err := e.RunGet(b.ctx, k)
		require.NoError(t, err)
		require.Len(t, run.Failures, 1)
		require.Equal(t, "constraint says no, once", run.Failures[0].Error)
		require.Equal(t, workflow.AttemptRetried, run.Failures[0].Outcome)
	})

	t.Run("PermanentAndLast", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wf := workflow.Define("fails", func(ctx context.Context, in int) (int, error) {
			return steps.Call(ctx, "charge", func(context.Context, string) (int, error) {
				if in == 1 {
					return 0, steps.Permanent(errors.New("card declined"))
				}
				return 0, errors.New("timeout")
			}, fastRetries(2))
		})
		e := b.engine(t, fastConfig(wf))
		_, err := wf.Run(b.ctx, e, k, 1, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		run, err := e.RunGet(b.ctx, k)
		require.NoError(t, err)
		require.Len(t, run.Failures, 1)
		require.Equal(t, workflow.AttemptPermanent, run.Failures[0].Outcome)

		k2 := idem.Key{Scope: "s", ID: "k2"}
		_, err = wf.Run(b.ctx, e, k2, 2, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		run, err = e.RunGet(b.ctx, k2)
		require.NoError(t, err)
		require.Len(t, run.Failures, 2)
		require.Equal(t, workflow.AttemptRetried, run.Failures[0].Outcome)
		require.Equal(t, workflow.AttemptFailed, run.Failures[1].Outcome)
		require.Equal(t, "timeout", run.Steps[0].Error)
	})

	t.Run("KeepsTheNewestAndClipsLongErrors", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		long := strings.Repeat("é", 3000) // 6000 bytes
		var n atomic.Int32
		wf := workflow.Define("noisy", func(ctx context.Context, _ int) (int, error) {
			return steps.Call(ctx, "charge", func(context.Context, string) (int, error) {
				return 0, fmt.Errorf("attempt %d: %s", n.Add(1), long)
			}, fastRetries(5))
		})
		cfg := fastConfig(wf)
		cfg.StepAttemptsKept = 3
		e := b.engine(t, cfg)
		_, err := wf.Run(b.ctx, e, k, 1, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		run, err := e.RunGet(b.ctx, k)
		require.NoError(t, err)
		require.Len(t, run.Failures, 3, "only the newest StepAttemptsKept")
		for i, a := range run.Failures {
			require.Equal(t, i+3, a.Attempt)
			require.LessOrEqual(t, len(a.Error), 2048)
			require.True(t, strings.HasPrefix(a.Error, fmt.Sprintf("attempt %d: é", i+3)))
			require.True(t, strings.HasSuffix(a.Error, "(clipped)"))
			require.True(t, strings.ToValidUTF8(a.Error, "?") == a.Error, "clipped on a rune boundary")
		}
	})

	t.Run("AStoppedAttemptIsRecorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(b.ctx)
		defer cancel()
		entered := make(chan struct{})
		wf := workflow.Define("stopped", func(ctx context.Context, _ int) (int, error) {
			if _, err := steps.Call(ctx, "first", func(context.Context, string) (int, error) { return 1, nil }, nil); err != nil {
				return 0, err
			}
			return steps.Call(ctx, "slow", func(ctx context.Context, _ string) (int, error) {
				close(entered)
				<-ctx.Done()
				return 0, ctx.Err()
			}, nil)
		})
		e := b.engine(t, fastConfig(wf))
		done := make(chan error, 1)
		go func() {
			_, err := wf.Run(ctx, e, k, 1, nil)
			done <- err
		}()
		<-entered
		cancel() // the process shuts down mid-step
		require.ErrorIs(t, <-done, context.Canceled)
		run, err := e.RunGet(b.ctx, k)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStateRunning, run.State)
		require.Len(t, run.Failures, 1)
		require.Equal(t, "slow", run.Failures[0].Step)
		require.Equal(t, workflow.AttemptStopped, run.Failures[0].Outcome)
	})
}
