// Package backoff is the one retry wait used across idem: capped exponential backoff with full
// jitter, and a sleep that ends early when the context is done. tx.Run, idem.Run, workflow
// steps, idemhttp.Transport and idemgrpc's client all wait through it, so a change to how idem
// backs off is made once.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter is capped exponential backoff with full jitter: the wait before retry n (1 for the
// first retry) is a random duration in (0, min·2^(n-1)], capped at max. Full jitter spreads
// clients that failed together, so they do not collide again in lockstep. A zero min means no
// wait at all.
type Jitter struct {
	Min, Max time.Duration
}

// Ceiling returns the largest wait Jitter may pick before retry n.
func (j Jitter) Ceiling(n int) time.Duration {
	if j.Min <= 0 {
		return 0
	}
	hi := max(j.Max, j.Min)
	ceiling := j.Min
	for i := 1; i < n && ceiling < hi; i++ {
		if ceiling > hi/2 { // doubling would pass hi, or overflow
			return hi
		}
		ceiling *= 2
	}
	return min(ceiling, hi)
}

// Wait returns a random wait before retry n, in (0, Ceiling(n)]; zero when Min is zero.
func (j Jitter) Wait(n int) time.Duration {
	c := j.Ceiling(n)
	if c <= 0 {
		return 0
	}
	return rand.N(c) + 1
}

// Sleep waits for d, or until ctx is done, and then returns ctx's error. A d of zero or less
// returns at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Poll paces a loop that asks again until a bound runs out: pauses from a first one, doubling up
// to a cap, never past the bound.
//
//	poll := backoff.NewPoll(wait, 10*time.Millisecond, 250*time.Millisecond)
//	for {
//		if done := try(); done {
//			return
//		}
//		if again, err := poll.Next(ctx); err != nil || !again {
//			return // ctx ended, or the bound ran out
//		}
//	}
type Poll struct {
	deadline   time.Time
	pause, max time.Duration
}

// NewPoll starts a bound of wait from now.
func NewPoll(wait, first, max time.Duration) *Poll {
	return &Poll{deadline: time.Now().Add(wait), pause: first, max: max}
}

// Next waits before the next try. It returns false when the bound has run out (the caller
// answers with its last result), and ctx's error when ctx ends first.
func (p *Poll) Next(ctx context.Context) (bool, error) {
	left := time.Until(p.deadline)
	if left <= 0 {
		return false, nil
	}
	if err := Sleep(ctx, min(p.pause, left)); err != nil {
		return false, err
	}
	p.pause = min(p.pause*2, p.max)
	return true, nil
}
