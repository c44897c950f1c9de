package idemhttp_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// go-retryablehttp's hook types, as declared there; RetryPolicy and RetryBackoff must fit them.
type (
	checkRetry  func(ctx context.Context, resp *http.Response, err error) (bool, error)
	backoffFunc func(min, max time.Duration, attemptNum int, resp *http.Response) time.Duration
)

var (
	_ checkRetry  = idemhttp.RetryPolicy
	_ backoffFunc = idemhttp.RetryBackoff
)

func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	resp := func(status int, header ...string) *http.Response {
		h := http.Header{}
		for i := 0; i+1 < len(header); i += 2 {
			h.Set(header[i], header[i+1])
		}
		return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(""))}
	}
	ctx := t.Context()
	for _, tt := range []struct {
		name  string
		resp  *http.Response
		err   error
		retry bool
	}{
		{"InFlight409", resp(409, "Retry-After", "1"), nil, true},
		{"429", resp(429), nil, true},
		{"503", resp(503), nil, true},
		{"501", resp(501), nil, false},
		{"Replayed409", resp(409, "Idempotent-Replayed", "true"), nil, false},
		{"Replayed500", resp(500, "Idempotent-Replayed", "true"), nil, false},
		{"Mismatch422", resp(422), nil, false},
		{"Created", resp(201), nil, false},
		{"NetworkError", nil, errors.New("connection reset by peer"), true},
		{"UntrustedCertificate", nil, &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, false},
	} {
		retry, err := idemhttp.RetryPolicy(ctx, tt.resp, tt.err)
		require.NoError(t, err, tt.name)
		require.Equal(t, tt.retry, retry, tt.name)
	}
	permanent := resp(500, "Content-Type", "application/problem+json")
	permanent.Body = io.NopCloser(strings.NewReader(`{"type":"` + idemhttp.DefaultProblemTypeBase + `response-too-large"}`))
	retry, _ := idemhttp.RetryPolicy(ctx, permanent, nil)
	require.False(t, retry, "a permanent 500 of the middleware is not retried")

	done, cancel := context.WithCancel(ctx)
	cancel()
	retry, err := idemhttp.RetryPolicy(done, nil, errors.New("reset"))
	require.False(t, retry)
	require.ErrorIs(t, err, context.Canceled)

	// Retry-After wins on any status, up to max, and the jitter stays within its bounds otherwise.
	require.Equal(t, 3*time.Second, idemhttp.RetryBackoff(time.Millisecond, 5*time.Second, 0, resp(409, "Retry-After", "3")))
	for n := range 10 {
		d := idemhttp.RetryBackoff(10*time.Millisecond, 40*time.Millisecond, n, resp(500))
		require.Positive(t, d)
		require.LessOrEqual(t, d, min(10*time.Millisecond<<n, 40*time.Millisecond))
	}
}

// TestRetryBackoffHonoursMax: a server's Retry-After cannot make a client wait longer than the
// max it configured, whether seconds or an HTTP date, however far off.
func TestRetryBackoffHonoursMax(t *testing.T) {
	t.Parallel()
	for _, ra := range []string{"3", "86400", "31536000", time.Now().Add(240 * time.Hour).UTC().Format(http.TimeFormat)} {
		resp := &http.Response{StatusCode: 503, Header: http.Header{"Retry-After": {ra}}}
		require.Equal(t, time.Second, idemhttp.RetryBackoff(time.Millisecond, time.Second, 0, resp), "Retry-After: %s", ra)
	}
	// Below max, Retry-After is honoured as it is.
	resp := &http.Response{StatusCode: 503, Header: http.Header{"Retry-After": {"2"}}}
	require.Equal(t, 2*time.Second, idemhttp.RetryBackoff(time.Millisecond, time.Minute, 0, resp))
}

// TestRetryPolicyAgainstMiddleware drives the middleware with a client loop shaped like
// go-retryablehttp's (check, back off, send the same request again): a duplicate sent while the
// first request runs is told 409, waits as Retry-After says, and gets the first response.
func TestRetryPolicyAgainstMiddleware(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inside, release := make(chan struct{}), make(chan struct{})
	h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b.runs.Load() == 0 {
			close(inside)
			<-release
		}
		b.create(w, r)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	send := func() (*http.Response, error) {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/effects", strings.NewReader("x"))
		req.Header.Set("X-User", "alice")
		req.Header.Set("Idempotency-Key", "k1")
		return srv.Client().Do(req)
	}

	first := make(chan *http.Response, 1)
	go func() {
		resp, _ := send()
		first <- resp
	}()
	<-inside
	var statuses []int
	var last *http.Response
	for attempt := 0; attempt < 5; attempt++ {
		resp, err := send()
		require.NoError(t, err)
		statuses = append(statuses, resp.StatusCode)
		retry, err := idemhttp.RetryPolicy(t.Context(), resp, nil)
		require.NoError(t, err)
		if !retry {
			last = resp
			break
		}
		wait := idemhttp.RetryBackoff(time.Millisecond, 5*time.Second, attempt, resp) // go-retryablehttp waits up to 30s by default
		require.GreaterOrEqual(t, wait, time.Second, "a 409 carries Retry-After, which the backoff honours")
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if attempt == 0 {
			close(release) // the first request finishes while the duplicate waits
			<-first
		}
		time.Sleep(wait) // the client's own wait, as go-retryablehttp does
	}
	require.NotNil(t, last, "the duplicate never got a final answer: %v", statuses)
	defer last.Body.Close()
	require.Equal(t, http.StatusConflict, statuses[0])
	require.Equal(t, http.StatusCreated, last.StatusCode)
	require.Equal(t, "true", last.Header.Get("Idempotent-Replayed"))
	require.EqualValues(t, 1, b.runs.Load())
}
