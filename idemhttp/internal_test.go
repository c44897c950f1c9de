package idemhttp

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"99999999999999", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"soon", 0, false},
	} {
		got, ok := parseRetryAfter(tc.in, now)
		require.Equal(t, tc.ok, ok, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	tr := &Transport{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	for attempt := 1; attempt < 70; attempt++ {
		ceiling := min(10*time.Millisecond<<min(attempt-1, 20), 50*time.Millisecond)
		for range 20 {
			d := tr.backoff(attempt)
			require.Positive(t, d)
			require.LessOrEqual(t, d, ceiling, "attempt %d", attempt)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	require.EqualValues(t, 1, retryAfterSeconds(time.Nanosecond))
	require.EqualValues(t, 1, retryAfterSeconds(time.Second))
	require.EqualValues(t, 2, retryAfterSeconds(1001*time.Millisecond))
}

func TestFormatKey(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"plain", `a"b`, `a\b`, `\"`} {
		got, err := ParseKey(formatKey(id))
		require.NoError(t, err)
		require.Equal(t, id, got)
	}
}

func TestNewSettings(t *testing.T) {
	t.Parallel()
	scope := func(*http.Request) string { return "s" }
	for _, tc := range []struct {
		cfg  *Config
		want string
	}{
		{nil, "Config cannot be nil"},
		{&Config{}, "Scope cannot be nil"},
		{&Config{Scope: scope, MismatchStatus: 409}, "MismatchStatus must be 422 or 400 (got 409)"},
		{&Config{Scope: scope, MaxBodyBytes: -1}, "MaxBodyBytes cannot be negative"},
		{&Config{Scope: scope, MaxResponseBytes: -1}, "MaxResponseBytes cannot be negative"},
		{&Config{Scope: scope, Methods: []string{"post"}}, `Methods must be upper-case method names (got "post")`},
		{&Config{Scope: scope, UnavailableRetryAfter: -time.Second}, "UnavailableRetryAfter cannot be negative"},
	} {
		_, err := newSettings(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := Middleware(nil, &Config{Scope: scope})
	require.ErrorContains(t, err, "db cannot be nil")
}

func TestRetryAfterZeroStillWaits(t *testing.T) {
	tr := &Transport{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	resp := &http.Response{StatusCode: http.StatusConflict, Header: http.Header{"Retry-After": {"0"}}}
	for attempt := 1; attempt < 50; attempt++ {
		wait, retry := tr.retryable(context.Background(), resp, nil, attempt)
		if !retry || wait <= 0 {
			t.Fatalf("attempt %d: wait %v, retry %v; want a positive wait", attempt, wait, retry)
		}
	}
}

func TestBackoffDoesNotOverflow(t *testing.T) {
	tr := &Transport{MinBackoff: time.Second, MaxBackoff: time.Duration(1<<63 - 1)}
	for attempt := 1; attempt < 80; attempt++ {
		if d := tr.backoff(attempt); d <= 0 {
			t.Fatalf("attempt %d: backoff %v", attempt, d)
		}
	}
}
