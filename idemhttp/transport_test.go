package idemhttp_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// fakeBase is a RoundTripper that answers from a script and records what it was sent.
type fakeBase struct {
	mu       sync.Mutex
	keys     []string
	bodies   []string
	respond  func(attempt int, r *http.Request) (*http.Response, error)
	returned []*trackedBody
}

func (f *fakeBase) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		_ = r.Body.Close()
	}
	f.mu.Lock()
	f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
	f.bodies = append(f.bodies, string(body))
	n := len(f.keys)
	f.mu.Unlock()
	resp, err := f.respond(n, r)
	if resp != nil {
		tb := &trackedBody{Reader: strings.NewReader("response body")}
		resp.Body = tb
		f.mu.Lock()
		f.returned = append(f.returned, tb)
		f.mu.Unlock()
	}
	return resp, err
}

func (f *fakeBase) attempts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.keys)
}

type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

// answer builds a response with the given status and header pairs.
func answer(status int, kv ...string) *http.Response {
	h := make(http.Header)
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return &http.Response{StatusCode: status, Status: http.StatusText(status), Header: h}
}

func TestTransport(t *testing.T) {
	t.Parallel()

	post := func(t *testing.T, body string) *http.Request {
		req, err := http.NewRequestWithContext(t.Context(), "POST", "http://api.test/orders", strings.NewReader(body))
		require.NoError(t, err)
		return req
	}
	transport := func(f *fakeBase) *idemhttp.Transport {
		return &idemhttp.Transport{Base: f, MinBackoff: time.Microsecond, MaxBackoff: time.Millisecond}
	}

	t.Run("AddsAUUIDv7KeyWithoutTouchingTheRequest", func(t *testing.T) {
		t.Parallel()
		f := &fakeBase{respond: func(int, *http.Request) (*http.Response, error) { return answer(201), nil }}
		req := post(t, "x")
		resp, err := transport(f).RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		require.Empty(t, req.Header.Get("Idempotency-Key"))

		id, err := idemhttp.ParseKey(f.keys[0])
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(f.keys[0], `"`))
		u, err := uuid.Parse(id)
		require.NoError(t, err)
		require.EqualValues(t, 7, u.Version())
	})

	t.Run("BareKeyAndCallersKey", func(t *testing.T) {
		t.Parallel()
		f := &fakeBase{respond: func(int, *http.Request) (*http.Response, error) { return answer(201), nil }}
		tr := transport(f)
		tr.BareKey = true
		tr.NewKey = func() string { return "generated" }
		_, err := tr.RoundTrip(post(t, ""))
		require.NoError(t, err)
		req := post(t, "")
		req.Header.Set("Idempotency-Key", "mine")
		_, err = tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, []string{"generated", "mine"}, f.keys)
	})

	t.Run("RetriesWithSameKeyAndBody", func(t *testing.T) {
		t.Parallel()
		f := &fakeBase{respond: func(n int, _ *http.Request) (*http.Response, error) {
			switch n {
			case 1:
				return nil, errors.New("connection reset by peer")
			case 2:
				return answer(http.StatusServiceUnavailable), nil
			case 3:
				return answer(http.StatusTooManyRequests, "Retry-After", "0"), nil
			case 4:
				return answer(http.StatusConflict, "Retry-After", "0"), nil
			default:
				return answer(http.StatusCreated), nil
			}
		}}
		resp, err := transport(f).RoundTrip(post(t, "payload"))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, 5, f.attempts())
		for i := range f.keys {
			require.Equal(t, f.keys[0], f.keys[i])
			require.Equal(t, "payload", f.bodies[i])
		}
		// Every discarded response was closed; the returned one is the caller's to close.
		for _, b := range f.returned[:len(f.returned)-1] {
			require.True(t, b.closed.Load())
		}
		require.False(t, f.returned[len(f.returned)-1].closed.Load())
	})

	t.Run("ReplayedIsNeverRetried", func(t *testing.T) {
		t.Parallel()
		for _, status := range []int{http.StatusConflict, http.StatusServiceUnavailable, http.StatusTooManyRequests} {
			f := &fakeBase{respond: func(int, *http.Request) (*http.Response, error) {
				return answer(status, "Idempotent-Replayed", "true"), nil
			}}
			resp, err := transport(f).RoundTrip(post(t, ""))
			require.NoError(t, err)
			require.Equal(t, status, resp.StatusCode)
			require.Equal(t, 1, f.attempts())
		}
	})

	t.Run("FinalStatusesAreNotRetried", func(t *testing.T) {
		t.Parallel()
		for _, status := range []int{200, 201, 400, 404, 422, http.StatusNotImplemented} {
			f := &fakeBase{respond: func(int, *http.Request) (*http.Response, error) { return answer(status), nil }}
			resp, err := transport(f).RoundTrip(post(t, ""))
			require.NoError(t, err)
			require.Equal(t, status, resp.StatusCode)
			require.Equal(t, 1, f.attempts(), status)
		}
	})

	t.Run("GivesUpAfterMaxAttempts", func(t *testing.T) {
		t.Parallel()
		f := &fakeBase{respond: func(int, *http.Request) (*http.Response, error) { return answer(http.StatusBadGateway), nil }}
		tr := transport(f)
		tr.MaxAttempts = 3
		resp, err := tr.RoundTrip(post(t, ""))
		require.NoError(t, err)
		require.Equal(t, http.StatusBadGateway, resp.StatusCode)
		body, err := io.ReadAll(resp.Body) // the last response is returned intact
		require.NoError(t, err)
		require.Equal(t, "response body", string(body))
		require.Equal(t, 3, f.attempts())

		boom := errors.New("no route to host")
		f = &fakeBase{respond: func(int, *http.Request) (*http.Response, error) { return nil, boom }}
		tr = transport(f)
		tr.MaxAttempts = 3
		_, err = tr.RoundTrip(post(t, ""))
		require.ErrorIs(t, err, boom)
		require.ErrorContains(t, err, "giving up after 3 attempts")
	})

	t.Run("RefusesABodyItCannotRewind", func(t *testing.T) {
		t.Parallel()
		f := &fakeBase{respond: func(int, *http.Request) (*http.Response, error) { return answer(201), nil }}
		body := &trackedBody{Reader: strings.NewReader("once only")}
		req, err := http.NewRequest("POST", "http://api.test/orders", body)
		require.NoError(t, err)
		require.Nil(t, req.GetBody)
		_, err = transport(f).RoundTrip(req)
		require.ErrorIs(t, err, idemhttp.ErrBodyNotRewindable)
		require.Zero(t, f.attempts())
		require.True(t, body.closed.Load())
	})

	t.Run("OtherMethodsPassThroughOnce", func(t *testing.T) {
		t.Parallel()
		f := &fakeBase{respond: func(int, *http.Request) (*http.Response, error) { return answer(503), nil }}
		req, err := http.NewRequest("GET", "http://api.test/orders", nil)
		require.NoError(t, err)
		resp, err := transport(f).RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 503, resp.StatusCode)
		require.Equal(t, []string{""}, f.keys)
	})

	t.Run("RetryAfterBeyondMaxIsReturned", func(t *testing.T) {
		t.Parallel()
		f := &fakeBase{respond: func(int, *http.Request) (*http.Response, error) {
			return answer(http.StatusServiceUnavailable, "Retry-After", "3600"), nil
		}}
		resp, err := transport(f).RoundTrip(post(t, ""))
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Equal(t, 1, f.attempts())
	})

	t.Run("StopsWhenContextIsDone", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		f := &fakeBase{respond: func(int, *http.Request) (*http.Response, error) {
			cancel() // the caller gives up while the transport would wait 20 s
			return answer(http.StatusConflict, "Retry-After", "20"), nil
		}}
		req := post(t, "").WithContext(ctx)
		_, err := transport(f).RoundTrip(req)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "Conflict")
		require.Equal(t, 1, f.attempts())
		require.True(t, f.returned[0].closed.Load())

		// Nor is a server whose certificate is not trusted.
		f = &fakeBase{respond: func(int, *http.Request) (*http.Response, error) {
			return nil, &tls.CertificateVerificationError{Err: errors.New("unknown authority")}
		}}
		_, err = transport(f).RoundTrip(post(t, ""))
		var certErr *tls.CertificateVerificationError
		require.ErrorAs(t, err, &certErr)
		require.Equal(t, 1, f.attempts())

		// An error caused by the caller's context is not retried either.
		ctx, cancel = context.WithCancel(t.Context())
		f = &fakeBase{respond: func(int, *http.Request) (*http.Response, error) {
			cancel()
			return nil, context.Canceled
		}}
		_, err = transport(f).RoundTrip(post(t, "").WithContext(ctx))
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 1, f.attempts())
	})
}

// TestTransportEdgeCases covers the corners a retrying client gets wrong most easily.
func TestTransportEdgeCases(t *testing.T) {
	t.Parallel()

	t.Run("PermanentServerProblemIsNotRetried", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"type":"https://example.test/idemhttp#streaming-response-refused","title":"x"}`))
		}))
		defer srv.Close()
		c := &http.Client{Transport: &idemhttp.Transport{MinBackoff: time.Millisecond}}
		resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("x"))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, int32(1), calls.Load())
		require.Contains(t, string(body), "streaming-response-refused", "the body reaches the caller whole")
	})

	t.Run("UnrewindableBodyIsFineWithOneAttempt", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
		defer srv.Close()
		req, err := http.NewRequest("POST", srv.URL, io.NopCloser(strings.NewReader("x")))
		require.NoError(t, err)
		req.GetBody = nil
		resp, err := (&idemhttp.Transport{MaxAttempts: 1}).RoundTrip(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	})
}
