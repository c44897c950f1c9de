package idemhttp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/digest"
)

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `8e03978e-40d5-43e8-bc93-6894a57f9324`,
		`"a\"b\\c"`, `"a";p=1`, `"a" "b"`, `"`, `""`, ` "x" `, `"\x"`, "\"\x7f\"", `a b`, "caf\xc3\xa9",
		strings.Repeat("k", 255), `"` + strings.Repeat("k", 256) + `"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		id, err := ParseKey(value)
		if err != nil {
			if id != "" {
				t.Fatalf("ParseKey(%q) returned %q with error %v", value, id, err)
			}
			if !strings.Contains(err.Error(), "invalid key") {
				t.Fatalf("ParseKey(%q) error does not say the key is invalid: %v", value, err)
			}
			return
		}
		if err := idem.ValidateID(id); err != nil {
			t.Fatalf("ParseKey(%q) = %q, which idem refuses: %v", value, id, err)
		}
		// Both forms of the parsed key name the same key; a bare key cannot begin with a
		// quote, which starts the quoted form.
		forms := []string{formatKey(id)}
		if !strings.HasPrefix(id, `"`) {
			forms = append(forms, id)
		}
		for _, form := range forms {
			again, err := ParseKey(form)
			if err != nil || again != id {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q (from %q)", form, again, err, id, value)
			}
		}
	})
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,false,null,"x"]}`, ` { "a" : { "c" : 1.50 , "b" : -0 } } `, `[]`, `{}`, `"\u00e9\ud800"`,
		`{"a":1,"a":2}`, `1e400`, `[[[[[[]]]]]]`, `{"<&>":"\u2028"}`, `{"a":1} {"b":2}`, `{"a":`, "\"\xff\"",
		`"\ud800"`, `"\udfff"`, `"\ufffd"`, `"\ud83d\ude00"`, `"\udc00\ud800"`, `{"\ud800":1}`, `"\\ud800"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		canon, err := CanonicalJSON(data)
		// The canonical form, and whether there is one, are those of the canonicaliser stored
		// keys were made with.
		old, oldErr := canonicalJSONV0(data)
		if (err == nil) != (oldErr == nil) || !bytes.Equal(canon, old) {
			t.Fatalf("CanonicalJSON(%q) = %q, %v; the encoding/json one gave %q, %v", data, canon, err, old, oldErr)
		}
		lone := hasLoneSurrogate(data)
		if err != nil {
			if json.Valid(data) && utf8.Valid(data) && !lone && !strings.Contains(err.Error(), "nested") {
				t.Fatalf("CanonicalJSON refused valid JSON %q: %v", data, err)
			}
			return
		}
		// The decoder reads an unpaired surrogate escape as U+FFFD, like "\ufffd" itself: a
		// canonical form of such a body would equal that of another body.
		if lone {
			t.Fatalf("CanonicalJSON(%q) = %q, but the input has an unpaired surrogate escape", data, canon)
		}
		if !json.Valid(canon) {
			t.Fatalf("CanonicalJSON(%q) = %q, not valid JSON", data, canon)
		}
		// The digest written as the canonical form is made, through a buffer, has the same
		// bytes as the canonical form held whole.
		whole, streamed := digest.New(), digest.New()
		whole.Part(len(canon))
		_, _ = whole.Write(canon)
		if !canonicalDigest(streamed, data) || !bytes.Equal(whole.Sum(), streamed.Sum()) {
			t.Fatalf("canonicalDigest(%q) differs from the digest of CanonicalJSON's %q", data, canon)
		}
		again, err := CanonicalJSON(canon)
		if err != nil || !bytes.Equal(again, canon) {
			t.Fatalf("not stable: %q -> %q -> %q (%v)", data, canon, again, err)
		}
		// Same value for a decoder (duplicate keys included: the last still wins).
		if a, b := decode(t, data), decode(t, canon); !reflect.DeepEqual(a, b) {
			t.Fatalf("CanonicalJSON(%q) = %q changed the value: %#v != %#v", data, canon, a, b)
		}
		// Another encoding of the same JSON gets the same fingerprint.
		var indented bytes.Buffer
		if err := json.Indent(&indented, data, "\t", "   "); err != nil {
			t.Fatalf("json.Indent refused %q: %v", data, err)
		}
		if !bytes.Equal(fingerprintJSON(data), fingerprintJSON(indented.Bytes())) {
			t.Fatalf("%q and its indented form %q have different fingerprints", data, indented.Bytes())
		}
	})
}

// jsonString matches a JSON string literal; escapeRE one escape in it.
var (
	jsonString = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	escapeRE   = regexp.MustCompile(`\\(u[0-9a-fA-F]{4}|.)`)
)

// hasLoneSurrogate is the test's own reading of the input, for comparison with CanonicalJSON's:
// whether a string literal has an escaped UTF-16 surrogate half that is not part of a pair.
func hasLoneSurrogate(data []byte) bool {
	for _, lit := range jsonString.FindAll(data, -1) {
		var units []uint16 // consecutive \u escapes; anything else ends a run
		flush := func() bool {
			for i := 0; i < len(units); i++ {
				switch u := rune(units[i]); {
				case u >= 0xd800 && u < 0xdc00 && i+1 < len(units) && units[i+1] >= 0xdc00 && units[i+1] < 0xe000:
					i++
				case u >= 0xd800 && u < 0xe000:
					return true
				}
			}
			units = units[:0]
			return false
		}
		last := 0
		for _, m := range escapeRE.FindAllSubmatchIndex(lit, -1) {
			if m[0] != last && flush() { // characters between escapes end a run
				return true
			}
			last = m[1]
			esc := lit[m[2]:m[3]]
			if esc[0] != 'u' || len(esc) != 5 {
				if flush() {
					return true
				}
				continue
			}
			v, _ := strconv.ParseUint(string(esc[1:]), 16, 16)
			units = append(units, uint16(v))
		}
		if flush() {
			return true
		}
	}
	return false
}

func decode(t *testing.T, data []byte) any {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %q: %v", data, err)
	}
	return v
}

func fingerprintJSON(body []byte) []byte {
	r := httptest.NewRequest(http.MethodPost, "/x?y=1", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	return DefaultFingerprint(r, body)
}
