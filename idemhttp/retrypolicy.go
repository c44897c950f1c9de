package idemhttp

import (
	"context"
	"net/http"
	"time"

	"github.com/idemkit/idem/internal/backoff"
)

// RetryPolicy is the retry decision of [Transport] for other retrying HTTP clients. It has the
// signature of go-retryablehttp's CheckRetry (and of similar hooks elsewhere), using only
// net/http types, so it plugs in without idem depending on such a client:
//
//	client := retryablehttp.NewClient()
//	client.CheckRetry = idemhttp.RetryPolicy
//	client.Backoff = idemhttp.RetryBackoff
//	req, _ := retryablehttp.NewRequest("POST", url, body)
//	req.Header.Set("Idempotency-Key", uuid.Must(uuid.NewV7()).String()) // one key, every attempt
//	resp, err := client.Do(req)
//
// Generic policies, go-retryablehttp's default among them, retry 429 and 5xx but not 409, and
// honour Retry-After only on 429 and 503. [Middleware] answers 409 with Retry-After while the
// first request with a key is still running, and the right move then is to wait and ask again
// with the same key, which gets the first request's response. RetryPolicy retries:
//
//   - a network error, but for an untrusted certificate (a response may have been lost on the
//     way back: the retry replays it);
//   - 409, 429 and every 5xx but 501 and the middleware's permanent 500s
//     (streaming-response-refused, response-too-large, idempotency-misconfigured);
//   - never a response marked Idempotent-Replayed: true, whatever its status: it is the final
//     answer, and asking again would get it again.
//
// It returns ctx's error once ctx is done. The client must send the same Idempotency-Key on
// every attempt: set it on the request before the first one, as above. Transport does all of
// this by itself.
func RetryPolicy(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return false, ctxErr
	}
	return shouldRetry(ctx, resp, err, DefaultReplayedHeader), nil
}

// RetryBackoff is the wait of [Transport] before a retry, with the signature of
// go-retryablehttp's Backoff (see [RetryPolicy]): the response's Retry-After when it has one,
// whatever its status (409 and 503 from [Middleware] carry one), and otherwise, or when
// Retry-After asks for less, full jitter up to min·2^attemptNum. The wait is never more than
// max, whatever Retry-After asks for: a server cannot park the client longer than it chose.
// attemptNum counts retries from 0, as go-retryablehttp does.
//
//	client.Backoff = idemhttp.RetryBackoff // with client.RetryWaitMin, client.RetryWaitMax
func RetryBackoff(min, max time.Duration, attemptNum int, resp *http.Response) time.Duration {
	wait := backoff.Jitter{Min: min, Max: max}.Wait(attemptNum + 1)
	if resp != nil {
		if ra, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok && ra > wait {
			wait = ra
		}
	}
	return clamp(wait, max)
}

// clamp bounds d by max, when max is set.
func clamp(d, max time.Duration) time.Duration {
	if max > 0 && d > max {
		return max
	}
	return d
}
