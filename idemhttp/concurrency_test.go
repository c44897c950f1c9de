package idemhttp_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// statusCounter counts, outside the middleware, the responses the server sends with status.
type statusCounter struct {
	status int
	n      atomic.Int64
	hit    func(n int64)
}

func (c *statusCounter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&statusWriter{ResponseWriter: w, c: c}, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	c *statusCounter
}

func (w *statusWriter) WriteHeader(code int) {
	w.ResponseWriter.WriteHeader(code)
	if code == w.c.status {
		w.c.hit(w.c.n.Add(1))
	}
}

func TestConcurrency(t *testing.T) {
	t.Parallel()
	const callers = 100

	// blockingServer serves b.create behind the middleware. The first request to reach the
	// handler waits until every other caller's first attempt has been answered 409, so that all
	// of them really are concurrent with it; any other request goes straight through (and would
	// show as a second effect).
	blockingServer := func(t *testing.T, b *testBundle) *httptest.Server {
		release := make(chan struct{})
		var entered atomic.Int64
		conflicts := &statusCounter{status: http.StatusConflict, hit: func(n int64) {
			if n == callers-1 {
				close(release)
			}
		}}
		h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if entered.Add(1) == 1 {
				<-release
			}
			b.create(w, r)
		}))
		srv := httptest.NewServer(conflicts.wrap(h))
		t.Cleanup(srv.Close)
		return srv
	}

	newRequest := func(t *testing.T, url string) *http.Request {
		req, err := http.NewRequest("POST", url+"/effects", strings.NewReader(`{"sku":"A-1"}`))
		require.NoError(t, err)
		req.Header.Set("X-User", "alice")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"one-key-for-all"`)
		return req
	}

	type result struct {
		status   int
		replayed string
		body     string
		err      error
	}
	fire := func(t *testing.T, client *http.Client, url string) []result {
		results := make([]result, callers)
		var wg sync.WaitGroup
		for i := range callers {
			req := newRequest(t, url) // built here: require must not run in another goroutine
			wg.Go(func() {
				resp, err := client.Do(req)
				if err != nil {
					results[i].err = err
					return
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				results[i] = result{resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body), err}
			})
		}
		wg.Wait()
		return results
	}

	t.Run("OneExecutionTheRestConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		srv := blockingServer(t, b)
		base := &http.Transport{MaxConnsPerHost: callers}
		t.Cleanup(base.CloseIdleConnections)
		client := &http.Client{Transport: base}

		var created, conflicts int
		var createdBody string
		for _, res := range fire(t, client, srv.URL) {
			require.NoError(t, res.err)
			switch res.status {
			case http.StatusCreated:
				created++
				createdBody = res.body
			case http.StatusConflict:
				conflicts++
				require.Contains(t, res.body, "idempotency-key-in-flight")
			default:
				t.Fatalf("unexpected status %d: %s", res.status, res.body)
			}
		}
		require.Equal(t, 1, created)
		require.Equal(t, callers-1, conflicts)
		require.Equal(t, 1, b.effects(t))

		resp, err := client.Do(newRequest(t, srv.URL))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
		require.Equal(t, createdBody, string(body))
	})

	t.Run("ThroughTransportAllGetTheSame201", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		srv := blockingServer(t, b)
		base := &http.Transport{MaxConnsPerHost: callers}
		t.Cleanup(base.CloseIdleConnections)
		client := &http.Client{Transport: &idemhttp.Transport{Base: base}}

		results := fire(t, client, srv.URL)
		for _, res := range results {
			require.NoError(t, res.err)
			require.Equal(t, http.StatusCreated, res.status, res.body)
			require.Equal(t, results[0].body, res.body)
		}
		require.JSONEq(t, `{"id":1}`, results[0].body)
		require.Equal(t, 1, b.effects(t))
		require.EqualValues(t, 1, b.runs.Load())
	})
}

// TestLostResponse is the failure the Transport exists for: the server commits, then the
// connection dies before the response arrives. The retry must get the stored response, not run
// the handler again.
func TestLostResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	guarded := b.middleware(t, nil)(http.HandlerFunc(b.create))

	var (
		mu   sync.Mutex
		keys []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		first := len(keys) == 1
		mu.Unlock()
		if !first {
			guarded.ServeHTTP(w, r)
			return
		}
		// The middleware commits and writes its response into the void; then the
		// connection is cut before a byte of it reaches the client.
		guarded.ServeHTTP(&discardWriter{header: make(http.Header)}, r)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.(*net.TCPConn).SetLinger(0) // a reset, not a polite FIN
			_ = conn.Close()
		}
	}))
	t.Cleanup(srv.Close)

	// No keep-alive: net/http's own transport then never retries by itself (it only retries
	// on a reused connection), so the retry seen here is the idemhttp Transport's.
	base := &http.Transport{DisableKeepAlives: true}
	client := &http.Client{Transport: &idemhttp.Transport{Base: base, MinBackoff: time.Millisecond}}
	req, err := http.NewRequest("POST", srv.URL+"/effects", strings.NewReader("once"))
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	require.JSONEq(t, `{"id":1}`, string(body))
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1])
	require.Equal(t, 1, b.effects(t))
	require.EqualValues(t, 1, b.runs.Load())
}

type discardWriter struct{ header http.Header }

func (d *discardWriter) Header() http.Header         { return d.header }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
