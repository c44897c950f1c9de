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

	// encoding/json decodes an unpaired surrogate escape to U+FFFD, so a canonical form would
	// make these three bodies one request; they are three, and a key reused across them must
	// be refused, not replayed.
	surrogates := map[string]string{}
	for _, body := range []string{`{"name":"\ud800"}`, `{"name":"\udfff"}`, `{"name":"\ufffd"}`, `{"name":"\udc00\ud800"}`} {
		f := fp("POST", "/a", "application/json", body)
		require.NotContains(t, surrogates, f, "%s has the fingerprint of %s", body, surrogates[f])
		surrogates[f] = body
	}
	// A proper pair is one character, escaped or not.
	require.Equal(t, fp("POST", "/a", "application/json", `{"name":"\ud83d\ude00"}`), fp("POST", "/a", "application/json", `{"name":"😀"}`))
}

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		` {"b" : 1, "a": {"d": [ ], "c": null}} `: `{"a":{"c":null,"d":[]},"b":1}`,
		`"<\u0026>"`:      `"<&>"`,
		`{"a":2,"a":1}`:   `{"a":2,"a":1}`,
		`[1.50, -0, 1e3]`: `[1.50,-0,1e3]`,
		`"\ud83d\ude00"`:  `"😀"`,
		`"\\ud800"`:       `"\\ud800"`,  // an escaped backslash, not an escape
		`"\ufffd"`:        "\"\uFFFD\"", // the character itself, which a lone surrogate is not
	} {
		got, err := idemhttp.CanonicalJSON([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, string(got), in)
	}
	for _, bad := range []string{
		``, `{`, `{"a":1}x`, `1 2`, "\"\xff\"", strings.Repeat("[", 600) + strings.Repeat("]", 600),
		`"\ud800"`, `"\uDFFF"`, `{"\udbff":1}`, `["\ud800\u0041"]`, `"\ud800\ud800"`, `"x\udc00"`,
	} {
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
