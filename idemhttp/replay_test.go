package idemhttp_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// TestReplay checks that a replay is byte for byte the stored response: status, end-to-end
// headers with all their values, and body.
func TestReplay(t *testing.T) {
	t.Parallel()

	// roundTrip serves the same keyed request twice and returns both responses.
	roundTrip := func(t *testing.T, cfg *idemhttp.Config, h http.HandlerFunc) (first, replay *http.Response, firstBody, replayBody []byte) {
		t.Helper()
		b := setup(t)
		mw := b.middleware(t, cfg)(h)
		w1 := serve(mw, request("POST", "/x", "k1", "payload"))
		w2 := serve(mw, request("POST", "/x", "k1", "payload"))
		require.Equal(t, "true", w2.Header().Get("Idempotent-Replayed"))
		require.Empty(t, w1.Header().Get("Idempotent-Replayed"))
		return w1.Result(), w2.Result(), w1.Body.Bytes(), w2.Body.Bytes()
	}

	t.Run("HeadersAndStatus", func(t *testing.T) {
		t.Parallel()
		first, replay, fb, rb := roundTrip(t, nil, func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Location", "/things/9")
			h.Set("ETag", `"v1"`)
			h.Add("X-Multi", "one")
			h.Add("X-Multi", "two")
			h.Add("Link", `</a>; rel="a"`)
			h.Add("Link", `</b>; rel="b"`)
			h.Set("Content-Type", "text/plain; charset=utf-8")
			h.Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT")
			h.Set("Connection", "X-Per-Hop")
			h.Set("X-Per-Hop", "gone")
			h.Set("Keep-Alive", "timeout=5")
			h.Add("Set-Cookie", "session=secret")
			w.WriteHeader(http.StatusCreated)
			// Changes after WriteHeader are not part of the response, as in net/http.
			h.Set("X-Late", "ignored")
			_, _ = w.Write([]byte("created"))
		})
		require.Equal(t, http.StatusCreated, first.StatusCode)
		require.Equal(t, http.StatusCreated, replay.StatusCode)
		require.Equal(t, []byte("created"), fb)
		require.Equal(t, fb, rb)
		for _, name := range []string{"Location", "Etag", "X-Multi", "Link", "Content-Type"} {
			require.Equal(t, first.Header.Values(name), replay.Header.Values(name), name)
		}
		require.Equal(t, []string{"one", "two"}, replay.Header.Values("X-Multi"))
		require.Equal(t, "7", replay.Header.Get("Content-Length"))
		require.Empty(t, first.Header.Get("X-Late"))

		// The first response is the handler's own, all of it.
		require.Equal(t, "session=secret", first.Header.Get("Set-Cookie"))
		require.Equal(t, "gone", first.Header.Get("X-Per-Hop"))
		// A replay leaves out what belongs to one connection, moment or session.
		for _, name := range []string{"Set-Cookie", "Date", "Connection", "X-Per-Hop", "Keep-Alive", "X-Late"} {
			require.Empty(t, replay.Header.Values(name), name)
		}
	})

	t.Run("BinaryBody", func(t *testing.T) {
		t.Parallel()
		body := make([]byte, 256)
		for i := range body {
			body[i] = byte(i)
		}
		_, replay, fb, rb := roundTrip(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(body[:100])
			_, _ = w.Write(body[100:])
		})
		require.Equal(t, http.StatusOK, replay.StatusCode)
		require.Equal(t, body, fb)
		require.Equal(t, body, rb)
	})

	t.Run("EmptyBodies", func(t *testing.T) {
		t.Parallel()
		for _, status := range []int{http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNoContent} {
			first, replay, fb, rb := roundTrip(t, nil, func(w http.ResponseWriter, r *http.Request) {
				if status != http.StatusOK { // a handler that writes nothing answers 200
					w.WriteHeader(status)
				}
			})
			require.Equal(t, status, first.StatusCode)
			require.Equal(t, status, replay.StatusCode)
			require.Empty(t, fb)
			require.Empty(t, rb)
		}
	})

	t.Run("SetCookieReplayedWhenConfigured", func(t *testing.T) {
		t.Parallel()
		_, replay, _, _ := roundTrip(t, &idemhttp.Config{ReplaySetCookie: true, DropHeaders: []string{"x-trace"}}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("Set-Cookie", "a=1")
			w.Header().Add("Set-Cookie", "b=2")
			w.Header().Set("X-Trace", "abc")
		})
		require.Equal(t, []string{"a=1", "b=2"}, replay.Header.Values("Set-Cookie"))
		require.Empty(t, replay.Header.Get("X-Trace"))
	})

	t.Run("ReplayedHeaderNameConfigurable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, &idemhttp.Config{ReplayedHeader: "X-Replayed"})(http.HandlerFunc(b.create))
		serve(h, request("POST", "/x", "k1", ""))
		w := serve(h, request("POST", "/x", "k1", ""))
		require.Equal(t, "true", w.Header().Get("X-Replayed"))
		require.Empty(t, w.Header().Get("Idempotent-Replayed"))
	})

	t.Run("ScopesAreIsolated", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := b.middleware(t, nil)(http.HandlerFunc(b.create))
		alice := serve(h, request("POST", "/x", "shared-key", "alice's"))
		r := request("POST", "/x", "shared-key", "bob's")
		r.Header.Set("X-User", "bob")
		bob := serve(h, r)
		require.Equal(t, http.StatusCreated, bob.Code)
		require.Empty(t, bob.Header().Get("Idempotent-Replayed"))
		require.NotEqual(t, alice.Body.String(), bob.Body.String())
		require.EqualValues(t, 2, b.runs.Load())

		// Bob's retry replays Bob's response, never Alice's.
		r = request("POST", "/x", "shared-key", "bob's")
		r.Header.Set("X-User", "bob")
		again := serve(h, r)
		require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
		require.Equal(t, bob.Body.String(), again.Body.String())
	})
}
