package idemhttp

// The canonicaliser that stored keys' fingerprints were made with, built on encoding/json's
// decoder: kept as the oracle that the streaming one in canonical.go is compared with (see
// FuzzCanonicalJSON and TestCanonicalJSONAgainstV0). It allocates and recurses per value, which
// is why it was replaced; its output is what must not change.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxJSONDepthV0 bounds the nesting canonicalJSONV0 follows, so that a body of a million '[' costs
// neither a deep recursion nor much time; such a body is then fingerprinted as raw bytes.
const maxJSONDepthV0 = 512

var errNotCanonicalizableV0 = errors.New("idemhttp: body cannot be put in canonical JSON form")

// canonicalJSONV0 returns data with insignificant whitespace removed, object members sorted by key
// and strings written with one escaping, so that two encodings of the same JSON value give the
// same bytes. Numbers are kept as written (1.0 and 1 stay different: the handler may well tell
// them apart). Members with the same key keep their relative order, so a decoder that lets the
// last one win sees the same value before and after. data must be one valid UTF-8 JSON value,
// nested at most 512 deep, without an unpaired surrogate escape (a \uD800–\uDFFF that is not
// half of a pair), or canonicalJSONV0 returns an error. [DefaultFingerprint] then digests the body
// as it is.
//
//	a, _ := idemhttp.canonicalJSONV0([]byte(`{"b": [1, 2], "a": "x"}`))
//	b, _ := idemhttp.canonicalJSONV0([]byte(`{"a":"x","b":[1,2]}`))
//	bytes.Equal(a, b) // true: {"a":"x","b":[1,2]}
func canonicalJSONV0(data []byte) ([]byte, error) {
	// The decoder turns invalid UTF-8 into U+FFFD, which would make different bodies equal.
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: it is not valid UTF-8", errNotCanonicalizableV0)
	}
	// So does an escaped surrogate half without its partner: "\ud800", "\udfff" and "\ufffd"
	// would all come out as U+FFFD.
	if off := loneSurrogateV0(data); off >= 0 {
		return nil, fmt.Errorf("%w: the escape at offset %d is half of a UTF-16 surrogate pair without the other half", errNotCanonicalizableV0, off)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(data))
	if err := canonicalValueV0(dec, &out, 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: there is more than one value", errNotCanonicalizableV0)
	}
	return out.Bytes(), nil
}

func canonicalValueV0(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %w", errNotCanonicalizableV0, err)
	}
	return canonicalTokenV0(dec, out, tok, depth)
}

func canonicalTokenV0(dec *json.Decoder, out *bytes.Buffer, tok json.Token, depth int) error {
	switch v := tok.(type) {
	case json.Delim:
		if depth >= maxJSONDepthV0 {
			return fmt.Errorf("%w: it is nested more than %d deep", errNotCanonicalizableV0, maxJSONDepthV0)
		}
		if v == '[' {
			return canonicalArrayV0(dec, out, depth+1)
		}
		return canonicalObjectV0(dec, out, depth+1)
	case string:
		writeStringV0(out, v)
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

func canonicalArrayV0(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	out.WriteByte('[')
	for i := 0; dec.More(); i++ {
		if i > 0 {
			out.WriteByte(',')
		}
		if err := canonicalValueV0(dec, out, depth); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // ']'
		return fmt.Errorf("%w: %w", errNotCanonicalizableV0, err)
	}
	out.WriteByte(']')
	return nil
}

func canonicalObjectV0(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	type member struct {
		key   string
		value []byte
	}
	var members []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %w", errNotCanonicalizableV0, err)
		}
		key, _ := tok.(string) // the decoder only yields strings here
		var value bytes.Buffer
		if err := canonicalValueV0(dec, &value, depth); err != nil {
			return err
		}
		members = append(members, member{key, value.Bytes()})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return fmt.Errorf("%w: %w", errNotCanonicalizableV0, err)
	}
	// Stable, so duplicate keys keep their order (see canonicalJSONV0).
	slices.SortStableFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			out.WriteByte(',')
		}
		writeStringV0(out, m.key)
		out.WriteByte(':')
		out.Write(m.value)
	}
	out.WriteByte('}')
	return nil
}

// writeStringV0 writes s as a JSON string with encoding/json's escaping, minus the HTML escapes,
// which only make the canonical form harder to read.
func writeStringV0(out *bytes.Buffer, s string) {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a string always encodes
	out.Truncate(out.Len() - 1) // Encode's newline
}

// loneSurrogateV0 returns the offset of the first \u escape, inside a string, of a UTF-16
// surrogate half that is not part of a high-low pair, or -1 if there is none. It expects JSON;
// on anything else its answer does not matter, since the decoder refuses it.
func loneSurrogateV0(data []byte) int {
	inString := false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c == '\\':
			u, ok := escapedUnitV0(data, i)
			if !ok {
				i++ // a one-character escape such as \" or \\
				continue
			}
			switch {
			case utf16.IsSurrogate(u) && u < 0xdc00: // high: a low one must follow at once
				if low, ok := escapedUnitV0(data, i+6); ok && low >= 0xdc00 && low <= 0xdfff {
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

// escapedUnitV0 reads a \uXXXX escape at data[i:], if there is one.
func escapedUnitV0(data []byte, i int) (rune, bool) {
	if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
	if err != nil {
		return 0, false
	}
	return rune(v), true
}
