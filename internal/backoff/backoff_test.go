package backoff

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestJitter(t *testing.T) {
	t.Parallel()
	j := Jitter{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	for n, want := range map[int]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 4: 80 * time.Millisecond, 5: 100 * time.Millisecond, 1000: 100 * time.Millisecond} {
		require.Equal(t, want, j.Ceiling(n), "retry %d", n)
		for range 200 {
			w := j.Wait(n)
			require.Greater(t, w, time.Duration(0))
			require.LessOrEqual(t, w, want)
		}
	}
	require.Zero(t, Jitter{}.Wait(3))
	// A max below min, or an enormous max, neither panics nor overflows.
	require.Equal(t, 10*time.Millisecond, Jitter{Min: 10 * time.Millisecond, Max: time.Millisecond}.Ceiling(5))
	require.Equal(t, time.Duration(1<<62), Jitter{Min: time.Second, Max: 1 << 62}.Ceiling(200))
}

func TestSleep(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, Sleep(ctx, time.Hour), context.Canceled)
	require.NoError(t, Sleep(context.Background(), time.Millisecond))
	require.NoError(t, Sleep(context.Background(), 0))
}

func TestPoll(t *testing.T) {
	// The bound runs out: Next says so instead of sleeping past it.
	p := NewPoll(20*time.Millisecond, time.Millisecond, 4*time.Millisecond)
	tries := 0
	for {
		tries++
		again, err := p.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !again {
			break
		}
		if p.pause > 4*time.Millisecond {
			t.Fatalf("pause %s grew past its cap", p.pause)
		}
	}
	if tries < 3 {
		t.Fatalf("a 20ms bound with pauses of 1-4ms allowed only %d tries", tries)
	}
	if time.Now().Before(p.deadline) {
		t.Fatal("Next reported the bound run out before its deadline")
	}

	// A context that ends stops the wait with its error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewPoll(time.Hour, time.Hour, time.Hour).Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
}
