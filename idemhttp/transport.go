package idemhttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/internal/backoff"
)

// Defaults used for the zero values of [Transport].
const (
	DefaultMaxAttempts   = 5
	DefaultMinBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff    = 5 * time.Second
	DefaultMaxRetryAfter = 30 * time.Second
)

// ErrBodyNotRewindable is returned by [Transport.RoundTrip] for a request it would have to retry
// but whose body it cannot send again. The request is refused before anything is sent, so that
// retrying does not work only until the first network error.
//
//	req, _ := http.NewRequest("POST", url, bytes.NewReader(payload)) // sets GetBody
//	_, err := client.Do(req)
//	if errors.Is(err, idemhttp.ErrBodyNotRewindable) { ... } // a one-shot body: buffer it first
var ErrBodyNotRewindable = errors.New("idemhttp: the request body cannot be rewound for a retry: set Request.GetBody (http.NewRequest does so for *bytes.Buffer, *bytes.Reader and *strings.Reader bodies)")

// maxDrain bounds how much of a discarded response is read so its connection can be reused;
// past that, closing the connection is cheaper.
const maxDrain = 64 << 10

// Transport is an http.RoundTripper that gives each request of a guarded method (POST and PATCH
// by default) an idempotency key, and retries it with the same key until it gets an answer. It
// is the client half of [Middleware], and works with any server that follows the IETF draft or
// Stripe's convention.
//
// A request without an Idempotency-Key header gets a new UUIDv7 key, in the draft's quoted form.
// A request that has one keeps it: set it yourself when the logical operation outlives one
// RoundTrip (a job that may be retried by a queue, for example).
//
// RoundTrip retries on a network error (but an untrusted certificate), on 409 (another attempt
// with the key is still in progress), 429 and 5xx (but 501), waiting as Retry-After says or,
// without it, a random time up to MinBackoff·2^n capped at MaxBackoff ("full jitter"). A response marked replayed
// (Idempotent-Replayed: true) is never retried, whatever its status: it is the final answer to
// the request, and asking again would get it again. It stops after MaxAttempts, returning the
// last response (or error), or when the request's context is done.
//
// The caller's request is never modified: every attempt is a clone. A body is sent again through
// GetBody; a request with a body and no GetBody is refused with [ErrBodyNotRewindable]. Bodies of
// discarded responses are drained and closed.
//
//	client := &http.Client{Transport: &idemhttp.Transport{}}
//	resp, err := client.Post("https://api.example.com/orders", "application/json",
//		strings.NewReader(`{"sku":"A-1"}`))
type Transport struct {
	// Base sends each attempt. Default: http.DefaultTransport.
	Base http.RoundTripper

	// Methods are the methods keyed and retried; others go to Base once, untouched. Default:
	// [DefaultMethods].
	Methods []string

	// KeyHeader and ReplayedHeader name the headers. Defaults: [DefaultKeyHeader] and
	// [DefaultReplayedHeader].
	KeyHeader      string
	ReplayedHeader string

	// BareKey sends generated keys bare (Stripe's form) rather than as the draft's quoted
	// string. Both forms are accepted by [Middleware].
	BareKey bool

	// NewKey makes a key for a request without one. Default: a UUIDv7.
	NewKey func() string

	// MaxAttempts bounds the attempts per request, the first included. Default:
	// [DefaultMaxAttempts]; 1 turns retrying off (keys are still added).
	MaxAttempts int

	// MinBackoff and MaxBackoff bound the wait before a retry without Retry-After. Defaults:
	// [DefaultMinBackoff] and [DefaultMaxBackoff].
	MinBackoff, MaxBackoff time.Duration

	// MaxRetryAfter is the longest Retry-After honoured; a response asking for a longer wait is
	// returned to the caller instead. Default: [DefaultMaxRetryAfter].
	MaxRetryAfter time.Duration
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	methods := t.Methods
	if len(methods) == 0 {
		methods = DefaultMethods()
	}
	if !slices.Contains(methods, req.Method) {
		return base.RoundTrip(req)
	}
	attempts := orDefault(t.MaxAttempts, DefaultMaxAttempts)
	hasBody := req.Body != nil && req.Body != http.NoBody
	if hasBody && req.GetBody == nil && attempts > 1 {
		_ = req.Body.Close() // a RoundTripper closes the body, even on error
		return nil, fmt.Errorf("%w (%s %s)", ErrBodyNotRewindable, req.Method, req.URL.Redacted())
	}

	keyHeader := orDefault(t.KeyHeader, DefaultKeyHeader)
	key := req.Header.Get(keyHeader)
	if key == "" {
		key = t.newKey()
	}
	ctx := req.Context()
	for attempt := 1; ; attempt++ {
		areq := req.Clone(ctx)
		areq.Header.Set(keyHeader, key)
		if attempt > 1 && hasBody {
			body, err := req.GetBody()
			if err != nil {
				return nil, fmt.Errorf("idemhttp: error rewinding the request body for attempt %d: %w", attempt, err)
			}
			areq.Body = body
		}
		resp, err := base.RoundTrip(areq)
		wait, retry := t.retryable(ctx, resp, err, attempt)
		if !retry {
			return resp, err
		}
		if attempt >= attempts {
			if err != nil && attempt > 1 {
				err = fmt.Errorf("idemhttp: giving up after %d attempts: %w", attempt, err)
			}
			return resp, err
		}
		discard(resp)
		if err := backoff.Sleep(ctx, wait); err != nil {
			last := err
			if resp != nil {
				last = fmt.Errorf("%s", resp.Status)
			}
			return nil, fmt.Errorf("idemhttp: stopped retrying after %d attempts because the request's context is done: %w (last outcome: %v)", attempt, err, last)
		}
	}
}

// retryable decides whether an attempt's outcome calls for another attempt, and after how long.
func (t *Transport) retryable(ctx context.Context, resp *http.Response, err error, attempt int) (time.Duration, bool) {
	if !shouldRetry(ctx, resp, err, orDefault(t.ReplayedHeader, DefaultReplayedHeader)) {
		return 0, false
	}
	if err != nil {
		return t.backoff(attempt), true
	}
	if ra, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		if ra > orDefault(t.MaxRetryAfter, DefaultMaxRetryAfter) {
			return 0, false
		}
		// Never less than the backoff: "Retry-After: 0" or a date in the past must not turn
		// into back-to-back retries.
		return max(ra, t.backoff(attempt)), true
	}
	return t.backoff(attempt), true
}

// shouldRetry is the retry decision of Transport and RetryPolicy: retry after a network error
// (but an untrusted certificate, or a done context), a 409 (the key's first request is still
// running), a 429 or a 5xx (but 501 and the middleware's permanent 500s), and never a response
// marked replayed, which is the final answer whatever its status.
func shouldRetry(ctx context.Context, resp *http.Response, err error, replayedHeader string) bool {
	if err != nil {
		// A caller that gave up, or a server whose certificate is not trusted, will not
		// change its mind. Anything else (refused, reset, EOF mid-response) may be a response
		// lost on the way back, which the retry replays.
		var certErr *tls.CertificateVerificationError
		return ctx.Err() == nil && !errors.As(err, &certErr)
	}
	if resp.Header.Get(replayedHeader) == "true" {
		return false
	}
	switch s := resp.StatusCode; {
	case s == http.StatusConflict, s == http.StatusTooManyRequests, s >= 500 && s != http.StatusNotImplemented:
	default:
		return false
	}
	return resp.StatusCode < 500 || !permanentProblem(resp)
}

// permanentProblems are the middleware's 500s that a retry of the same request cannot change:
// each retry would only run the handler's transaction again, to the same end.
var permanentProblems = []string{problemStreaming.name, problemTooLarge.name, problemMisconfigured.name}

// permanentProblem reports whether resp is one of permanentProblems. It reads the (small) body
// and puts it back, so the caller still gets the response whole.
func permanentProblem(resp *http.Response) bool {
	if resp.Body == nil || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		return false
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(data), resp.Body), resp.Body}
	if err != nil {
		return false
	}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &p) != nil {
		return false
	}
	for _, name := range permanentProblems {
		if strings.HasSuffix(p.Type, "#"+name) || strings.HasSuffix(p.Type, "/"+name) || p.Type == name {
			return true
		}
	}
	return false
}

// backoff is the wait before retry attempt (1 for the first retry): full jitter up to
// MinBackoff·2^(attempt-1), capped at MaxBackoff.
func (t *Transport) backoff(attempt int) time.Duration {
	return backoff.Jitter{Min: orDefault(t.MinBackoff, DefaultMinBackoff), Max: orDefault(t.MaxBackoff, DefaultMaxBackoff)}.Wait(attempt)
}

func (t *Transport) newKey() string {
	var id string
	if t.NewKey != nil {
		id = t.NewKey()
	} else {
		id = uuid.Must(uuid.NewV7()).String()
	}
	if t.BareKey {
		return id
	}
	return formatKey(id)
}

// parseRetryAfter reads delay-seconds or an HTTP-date (RFC 9110, section 10.2.3).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 || s > int64(365*24*time.Hour/time.Second) {
			return 0, false
		}
		return time.Duration(s) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

func discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	_ = resp.Body.Close()
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
