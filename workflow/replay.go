package workflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/telemetry"
)

// A replay runs a workflow function over a stored history exactly as a resumed run does, with
// the same runStep and the same matching of each step against the history (runState.match,
// Patched, unconsumed), but with nothing behind it: no database, no lease, no River. Where the
// code reaches the end of the history, the replay ends (a resumed run would run the next step
// there, which a replay never does); where it calls another step than the history holds, or
// returns before the end of it, that is the divergence a resumed run would fail with.

// replayEngine is the engine a replay's run belongs to: it sends nothing and records nothing.
var replayEngine = &Engine{cfg: Config{StepAttemptsKept: DefaultStepAttemptsKept}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	tel: telemetry.For(tracenoop.NewTracerProvider(), metricnoop.NewMeterProvider()), now: time.Now}

// replay replays run's history against def; see wfseam.Replay.
func replay(ctx context.Context, def Definition, run *RunRow) error {
	if run.Workflow != def.Name() {
		return fmt.Errorf("workflow: run %q in scope %q is a run of workflow %q, not of %q; replay it against %q", run.ID, run.Scope, run.Workflow, def.Name(), run.Workflow)
	}
	// Positions may have gaps (a parallel branch that had not completed), never repeats.
	history := stepHistory{steps: make(map[int]store.StepRecord, len(run.Steps))}
	for _, s := range run.Steps {
		if _, dup := history.steps[s.Seq]; dup || s.Seq < 1 {
			return fmt.Errorf("workflow: the history of run %q in scope %q has step #%d twice, or a position before #1; give it the run's steps as RunGet returns them", run.ID, run.Scope, s.Seq)
		}
		rec := store.StepRecord{Seq: s.Seq, Name: s.Name, Kind: s.Kind, Output: s.Output, Attempts: s.Attempts}
		if s.Failed || s.Error != "" {
			msg := s.Error
			rec.Error = &msg
		}
		history.steps[s.Seq] = rec
		history.last = max(history.last, s.Seq)
	}
	rs := replayEngine.newRun(def, run.Scope, run.ID, pgtype.UUID{})
	// Postgres's clock, as a replayed sleep reads it, is past every wake-up: a sleep that ended
	// passes, and a run asleep at the end of its history ends the replay at its next step.
	rs.replayOnly, rs.history, rs.created, rs.dbNow = true, history, run.Created.UnixMicro(), math.MaxInt64
	rs.markCommitted()

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rs.cancel = cancel
	_, panicked, ferr := callSafely(context.WithValue(runCtx, runKey{}, rs), def, run.Input)

	var nd *NonDeterminismError
	end := rs.ending()
	switch {
	case end != nil && end.kind == endReplayed:
		return nil // the code matched the history to its end
	case end != nil && errors.As(end.err, &nd):
		return nd
	case end != nil:
		return fmt.Errorf("workflow: the replay of run %q in scope %q stopped at step #%d: %w", run.ID, run.Scope, rs.position(), end.err)
	case panicked != nil:
		return fmt.Errorf("workflow: the replay of run %q in scope %q: %w", run.ID, run.Scope, ferr)
	case ctx.Err() != nil:
		return ctx.Err()
	}
	var mErr *machineryError
	if errors.As(ferr, &mErr) {
		return fmt.Errorf("workflow: the replay of run %q in scope %q: %w", run.ID, run.Scope, ferr)
	}
	if nd := rs.unconsumed(); nd != nil {
		return nd
	}
	return nil // the code returned after the whole history, as the run did or will
}

// position is the run's current position: the step last claimed.
func (rs *runState) position() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.next - 1
}
