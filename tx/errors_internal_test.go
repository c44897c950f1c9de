package tx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

type retryable bool

func (r retryable) Error() string   { return fmt.Sprintf("retryable(%t)", bool(r)) }
func (r retryable) Retryable() bool { return bool(r) }

func TestIsRetryable(t *testing.T) {
	t.Parallel()

	serialization := &pgconn.PgError{Severity: "ERROR", Code: "40001"}
	deadlock := &pgconn.PgError{Severity: "ERROR", Code: "40P01"}
	unique := &pgconn.PgError{Severity: "ERROR", Code: "23505"}

	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},
		{"Plain", errors.New("boom"), false},
		{"SerializationFailure", serialization, true},
		{"Deadlock", deadlock, true},
		{"OtherSQLState", unique, false},
		{"Wrapped", fmt.Errorf("error updating: %w", deadlock), true},
		{"JoinedAfterAnotherPgError", errors.Join(unique, fmt.Errorf("later: %w", serialization)), true},
		{"TwoWrapVerbs", fmt.Errorf("%w, then %w", unique, serialization), true},
		{"RetryableTrue", fmt.Errorf("wrapped: %w", retryable(true)), true},
		{"RetryableFalse", retryable(false), false},
		{"Cancelled", context.Canceled, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, IsRetryable(tt.err))
		})
	}
}

func TestCommitError(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name        string
		err         error
		wantUnknown bool
	}{
		{"SerializationFailure", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40001"}, false},
		{"DeferredConstraint", &pgconn.PgError{Severity: "ERROR", Code: "23505"}, false},
		{"LocalizedSeverity", &pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "23505"}, false},
		// A backend terminated while waiting for a synchronous standby
		// says FATAL after committing locally.
		{"Fatal", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, true},
		{"CommitRollback", pgx.ErrTxCommitRollback, false},
		{"TxClosed", pgx.ErrTxClosed, false},
		{"ConnClosed", pgconn.ErrConnClosed, true},
		{"UnexpectedEOF", io.ErrUnexpectedEOF, true},
		{"Cancelled", context.Canceled, true},
		{"DeadlineExceeded", context.DeadlineExceeded, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wrapped, unknown := commitError(tt.err)
			require.Equal(t, tt.wantUnknown, unknown)
			require.ErrorIs(t, wrapped, tt.err)
			require.Equal(t, tt.wantUnknown, errors.Is(wrapped, ErrCommitUnknown))
		})
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()

	t.Run("StaysUnderCappedCeiling", func(t *testing.T) {
		t.Parallel()
		cfg := newConfig([]Option{Backoff(10*time.Millisecond, 100*time.Millisecond)})
		for retry, ceiling := range map[int]time.Duration{
			1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 3: 40 * time.Millisecond,
			4: 80 * time.Millisecond, 5: 100 * time.Millisecond, 1000: 100 * time.Millisecond,
		} {
			for range 100 {
				d := cfg.backoff(retry)
				require.GreaterOrEqual(t, d, time.Duration(0))
				require.LessOrEqual(t, d, ceiling, "retry %d", retry)
			}
		}
	})

	t.Run("IsRandom", func(t *testing.T) {
		t.Parallel()
		cfg := newConfig([]Option{Backoff(time.Second, time.Second)})
		seen := make(map[time.Duration]bool)
		for range 10 {
			seen[cfg.backoff(1)] = true
		}
		require.Greater(t, len(seen), 1)
	})

	t.Run("DoesNotOverflow", func(t *testing.T) {
		t.Parallel()
		const huge = time.Duration(1<<63 - 1)
		cfg := newConfig([]Option{Backoff(huge/3, huge)})
		for range 100 {
			require.GreaterOrEqual(t, cfg.backoff(50), time.Duration(0))
		}
	})

	t.Run("ZeroMeansNoWait", func(t *testing.T) {
		t.Parallel()
		cfg := newConfig([]Option{Backoff(0, 0)})
		require.Zero(t, cfg.backoff(1))
		require.Zero(t, cfg.backoff(10))
	})

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		cfg := newConfig(nil)
		require.Equal(t, 10, cfg.maxAttempts)
		require.Equal(t, 5*time.Millisecond, cfg.backoffMin)
		require.Equal(t, 500*time.Millisecond, cfg.backoffMax)
	})
}
