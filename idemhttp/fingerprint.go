package idemhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idemkit/idem"
)

// FingerprintFunc digests a request into a value for idem.Key.Fingerprint. body is the whole
// request body, already read (the handler gets its own copy). Two requests under one key with
// different fingerprints are refused (422 by default) instead of replayed. Returning nil turns
// the check off for the request.
//
//	// A form body: the order of fields does not matter to this handler.
//	var formFingerprint idemhttp.FingerprintFunc = func(r *http.Request, body []byte) []byte {
//		values, _ := url.ParseQuery(string(body))
//		return idem.Fingerprint(r.Method, r.URL.Path, values.Encode()) // Encode sorts by key
//	}
type FingerprintFunc func(r *http.Request, body []byte) []byte

// DefaultFingerprint is the fingerprint used unless a [Config] or [RouteConfig] sets another.
// It covers the method, the escaped path, the raw query, the media type of Content-Type
// (lowercased, without parameters) and the body. A JSON body (application/json or any
// +json type) is first put in canonical form by [CanonicalJSON], so that a client that
// re-encodes its request on a retry, with other key order or whitespace, still matches.
//
// Headers other than Content-Type are left out on purpose: tracing, date and authorization
// headers may change between retries of one request.
//
//	cfg := &idemhttp.Config{
//		Scope: scope,
//		Fingerprint: func(r *http.Request, body []byte) []byte {
//			// This API ignores the query string.
//			return idem.Fingerprint(r.Method, r.URL.Path, string(body))
//		},
//	}
func DefaultFingerprint(r *http.Request, body []byte) []byte {
	mediaType := mediaTypeOf(r.Header.Get("Content-Type"))
	if isJSON(mediaType) {
		if canon, err := CanonicalJSON(body); err == nil {
			body = canon
		}
	}
	return idem.Fingerprint(r.Method, r.URL.EscapedPath(), r.URL.RawQuery, mediaType, string(body))
}

func mediaTypeOf(contentType string) string {
	if contentType == "" {
		return ""
	}
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		// Still part of the fingerprint, as written, so that garbage matches only itself.
		return strings.ToLower(strings.TrimSpace(contentType))
	}
	return mediaType
}

func isJSON(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}

// maxJSONDepth bounds the nesting CanonicalJSON follows, so that a body of a million '[' costs
// neither a deep recursion nor much time; such a body is then fingerprinted as raw bytes.
const maxJSONDepth = 512

var errNotCanonicalizable = errors.New("idemhttp: body cannot be put in canonical JSON form")

// CanonicalJSON returns data with insignificant whitespace removed, object members sorted by key
// and strings written with one escaping, so that two encodings of the same JSON value give the
// same bytes. Numbers are kept as written (1.0 and 1 stay different: the handler may well tell
// them apart). Members with the same key keep their relative order, so a decoder that lets the
// last one win sees the same value before and after. data must be one valid UTF-8 JSON value,
// nested at most 512 deep, without an unpaired surrogate escape (a \uD800–\uDFFF that is not
// half of a pair), or CanonicalJSON returns an error. [DefaultFingerprint] then digests the body
// as it is.
//
//	a, _ := idemhttp.CanonicalJSON([]byte(`{"b": [1, 2], "a": "x"}`))
//	b, _ := idemhttp.CanonicalJSON([]byte(`{"a":"x","b":[1,2]}`))
//	bytes.Equal(a, b) // true: {"a":"x","b":[1,2]}
func CanonicalJSON(data []byte) ([]byte, error) {
	// The decoder turns invalid UTF-8 into U+FFFD, which would make different bodies equal.
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: it is not valid UTF-8", errNotCanonicalizable)
	}
	// So does an escaped surrogate half without its partner: "\ud800", "\udfff" and "\ufffd"
	// would all come out as U+FFFD.
	if off := loneSurrogate(data); off >= 0 {
		return nil, fmt.Errorf("%w: the escape at offset %d is half of a UTF-16 surrogate pair without the other half", errNotCanonicalizable, off)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(data))
	if err := canonicalValue(dec, &out, 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: there is more than one value", errNotCanonicalizable)
	}
	return out.Bytes(), nil
}

func canonicalValue(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %w", errNotCanonicalizable, err)
	}
	return canonicalToken(dec, out, tok, depth)
}

func canonicalToken(dec *json.Decoder, out *bytes.Buffer, tok json.Token, depth int) error {
	switch v := tok.(type) {
	case json.Delim:
		if depth >= maxJSONDepth {
			return fmt.Errorf("%w: it is nested more than %d deep", errNotCanonicalizable, maxJSONDepth)
		}
		if v == '[' {
			return canonicalArray(dec, out, depth+1)
		}
		return canonicalObject(dec, out, depth+1)
	case string:
		writeString(out, v)
	case json.Number:
		out.WriteString(string(v))
	case bool:
		if v {
			out.WriteString("true")
		} else {
			out.WriteString("false")
		}
	case nil:
		out.WriteString("null")
	}
	return nil
}

func canonicalArray(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	out.WriteByte('[')
	for i := 0; dec.More(); i++ {
		if i > 0 {
			out.WriteByte(',')
		}
		if err := canonicalValue(dec, out, depth); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // ']'
		return fmt.Errorf("%w: %w", errNotCanonicalizable, err)
	}
	out.WriteByte(']')
	return nil
}

func canonicalObject(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	type member struct {
		key   string
		value []byte
	}
	var members []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %w", errNotCanonicalizable, err)
		}
		key, _ := tok.(string) // the decoder only yields strings here
		var value bytes.Buffer
		if err := canonicalValue(dec, &value, depth); err != nil {
			return err
		}
		members = append(members, member{key, value.Bytes()})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return fmt.Errorf("%w: %w", errNotCanonicalizable, err)
	}
	// Stable, so duplicate keys keep their order (see CanonicalJSON).
	slices.SortStableFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			out.WriteByte(',')
		}
		writeString(out, m.key)
		out.WriteByte(':')
		out.Write(m.value)
	}
	out.WriteByte('}')
	return nil
}

// writeString writes s as a JSON string with encoding/json's escaping, minus the HTML escapes,
// which only make the canonical form harder to read.
func writeString(out *bytes.Buffer, s string) {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a string always encodes
	out.Truncate(out.Len() - 1) // Encode's newline
}

// loneSurrogate returns the offset of the first \u escape, inside a string, of a UTF-16
// surrogate half that is not part of a high-low pair, or -1 if there is none. It expects JSON;
// on anything else its answer does not matter, since the decoder refuses it.
func loneSurrogate(data []byte) int {
	inString := false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c == '\\':
			u, ok := escapedUnit(data, i)
			if !ok {
				i++ // a one-character escape such as \" or \\
				continue
			}
			switch {
			case utf16.IsSurrogate(u) && u < 0xdc00: // high: a low one must follow at once
				if low, ok := escapedUnit(data, i+6); ok && low >= 0xdc00 && low <= 0xdfff {
					i += 11
					continue
				}
				return i
			case utf16.IsSurrogate(u): // low, without a high one before it
				return i
			}
			i += 5
		}
	}
	return -1
}

// escapedUnit reads a \uXXXX escape at data[i:], if there is one.
func escapedUnit(data []byte, i int) (rune, bool) {
	if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
	if err != nil {
		return 0, false
	}
	return rune(v), true
}
