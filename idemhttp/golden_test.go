package idemhttp_test

import (
	"encoding/hex"
	"encoding/json"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// goldenBodies are bodies whose fingerprints were recorded by the encoding/json-based
// canonicaliser that stored keys were made with: valid JSON in every shape, and bodies that are
// not canonicalised (invalid, lone surrogates, nested too deep), which are digested as they are.
func goldenBodies() []string {
	deep := func(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }
	return []string{
		``, ` `, `{}`, `[]`, `null`, `true`, `false`, `0`, `-0`, `1.50`, `1e400`, `-1.2E-3`, `"x"`,
		`{"b":1,"a":2}`, ` { "b" : [ 1 , 2 ] , "a" : { "d" : null , "c" : "x" } } `, `{"a":2,"a":1}`,
		`{"b":1,"a":2,"b":0,"a":3}`, `{"":1," ":2,"\u0000":3}`, `{"é":1,"e":2,"z":3,"\u00e9":4}`,
		`{"a\"":1,"a#":2,"a\\":3,"a/":4,"a\/":5}`, `["\u0041\n\t\r\b\f\u001f\u007f"]`, `"<&>\u003c\u0026"`,
		"\"\u2028\u2029\"", `"\u2028\u2029"`, `"\ud83d\ude00😀"`, `"\uFFFD"`, `"\ud800"`, `"\udfff"`,
		`{"\ud800":1}`, `"\\ud800"`, "\"\xff\"", "\"caf\xc3\xa9\"", `{"a":`, `{"a":1}x`, `1 2`, `[1,]`,
		`{"a":1,}`, `[01]`, `[1.]`, `[.5]`, `[+1]`, `"\x"`, "\"a\tb\"", `[tru]`, `{'a':1}`,
		deep(512), deep(513), strings.Repeat("[", 600) + strings.Repeat("]", 600),
		`{"z":{"y":{"x":[3,{"c":1,"b":2,"a":[{"q":0,"p":1}]}]}},"a":[]}`, "\ufeff{}", `{"a":1}` + "\n",
	}
}

// TestFingerprintsUnchanged holds DefaultFingerprint to the fingerprints keys were stored with:
// a key stored before an upgrade must match the same request after it. The recorded values are in
// testdata/fingerprints.json (IDEM_UPDATE_GOLDEN=1 rewrites it: only ever for a new body).
func TestFingerprintsUnchanged(t *testing.T) {
	t.Parallel()
	type entry struct {
		ContentType string `json:"content_type"`
		Body        []byte `json:"body"` // base64: some bodies are not UTF-8
		Fingerprint string `json:"fingerprint"`
	}
	var got []entry
	for _, ct := range []string{"application/json", "application/vnd.api+json; charset=utf-8", "text/plain"} {
		for _, body := range goldenBodies() {
			r := httptest.NewRequest("POST", "/orders?x=1", strings.NewReader(body))
			r.Header.Set("Content-Type", ct)
			got = append(got, entry{ct, []byte(body), hex.EncodeToString(idemhttp.DefaultFingerprint(r, []byte(body)))})
		}
	}
	const path = "testdata/fingerprints.json"
	if os.Getenv("IDEM_UPDATE_GOLDEN") == "1" {
		data, err := json.MarshalIndent(got, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, append(data, '\n'), 0o644))
	}
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var want []entry
	require.NoError(t, json.Unmarshal(data, &want))
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i], got[i], "body %q as %s", want[i].Body, want[i].ContentType)
	}
}
