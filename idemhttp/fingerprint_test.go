package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

func TestDefaultFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(method, target, contentType, body string) string {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		return string(idemhttp.DefaultFingerprint(r, []byte(body)))
	}
	base := fp("POST", "/a?q=1", "application/json", `{"x":1,"y":[1,2]}`)

	// Equivalent requests.
	require.Equal(t, base, fp("POST", "/a?q=1", "application/json", "{ \"y\": [1, 2],\n \"x\": 1 }"))
	require.Equal(t, base, fp("POST", "/a?q=1", "Application/JSON; charset=utf-8", `{"x":1,"y":[1,2]}`))
	require.Equal(t, fp("POST", "/a", "application/vnd.api+json", `{"a":1,"b":2}`), fp("POST", "/a", "application/vnd.api+json", `{"b":2,"a":1}`))

	// Different requests.
	for _, other := range []string{
		fp("PATCH", "/a?q=1", "application/json", `{"x":1,"y":[1,2]}`),
		fp("POST", "/b?q=1", "application/json", `{"x":1,"y":[1,2]}`),
		fp("POST", "/a?q=2", "application/json", `{"x":1,"y":[1,2]}`),
		fp("POST", "/a", "application/json", `{"x":1,"y":[1,2]}`),
		fp("POST", "/a?q=1", "text/plain", `{"x":1,"y":[1,2]}`),
		fp("POST", "/a?q=1", "application/json", `{"x":1,"y":[2,1]}`),
		fp("POST", "/a?q=1", "application/json", `{"x":1.0,"y":[1,2]}`),
	} {
		require.NotEqual(t, base, other)
	}
	// Only JSON is canonicalised: whitespace in text is content.
	require.NotEqual(t, fp("POST", "/a", "text/plain", `{"a":1}`), fp("POST", "/a", "text/plain", `{"a": 1}`))
	// Invalid JSON is compared as bytes.
	require.NotEqual(t, fp("POST", "/a", "application/json", `{"a":`), fp("POST", "/a", "application/json", `{"a": `))
}

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		` {"b" : 1, "a": {"d": [ ], "c": null}} `: `{"a":{"c":null,"d":[]},"b":1}`,
		`"<\u0026>"`:      `"<&>"`,
		`{"a":2,"a":1}`:   `{"a":2,"a":1}`,
		`[1.50, -0, 1e3]`: `[1.50,-0,1e3]`,
	} {
		got, err := idemhttp.CanonicalJSON([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, string(got), in)
	}
	for _, bad := range []string{``, `{`, `{"a":1}x`, `1 2`, "\"\xff\"", strings.Repeat("[", 600) + strings.Repeat("]", 600)} {
		_, err := idemhttp.CanonicalJSON([]byte(bad))
		require.Error(t, err, bad)
	}
}

func TestHeaderScope(t *testing.T) {
	t.Parallel()
	scope := idemhttp.HeaderScope("X-Api-Key")
	r := httptest.NewRequest("POST", "/", nil)
	require.Empty(t, scope(r))
	r.Header.Set("X-Api-Key", "secret-1")
	s1 := scope(r)
	require.True(t, strings.HasPrefix(s1, "x-api-key:"))
	require.NotContains(t, s1, "secret")
	r.Header.Set("X-Api-Key", "secret-2")
	require.NotEqual(t, s1, scope(r))
	require.LessOrEqual(t, len(s1), 255)
	_ = http.MethodPost
}
