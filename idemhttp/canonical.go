package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/digest"
)

// maxJSONDepth bounds the nesting CanonicalJSON follows; a body nested deeper is fingerprinted as
// raw bytes.
const maxJSONDepth = 512

var errNotCanonicalizable = errors.New("idemhttp: body cannot be put in canonical JSON form")

// CanonicalJSON returns data with insignificant whitespace removed, object members sorted by key
// and strings written with one escaping, so that two encodings of the same JSON value give the
// same bytes. Numbers are kept as written (1.0 and 1 stay different: the handler may well tell
// them apart). Members with the same key keep their relative order, so a decoder that lets the
// last one win sees the same value before and after. Strings are written as encoding/json writes
// them without HTML escaping: `"` and `\` escaped, control characters as \b, \f, \n, \r, \t or
// \u00XX, U+2028 and U+2029 as \u2028 and \u2029, everything else as UTF-8. data must be one
// valid UTF-8 JSON value, nested at most 512 deep, without an unpaired surrogate escape (a
// \uD800–\uDFFF that is not half of a pair), or CanonicalJSON returns an error.
// [DefaultFingerprint] then digests the body as it is.
//
// It reads data twice, without building a tree: once to check it and to find the objects whose
// members are out of order, once to write the result, whose size it knows by then. It
// allocates the result and, for objects out of order, an index of their members' keys.
//
//	a, _ := idemhttp.CanonicalJSON([]byte(`{"b": [1, 2], "a": "x"}`))
//	b, _ := idemhttp.CanonicalJSON([]byte(`{"a":"x","b":[1,2]}`))
//	bytes.Equal(a, b) // true: {"a":"x","b":[1,2]}
func CanonicalJSON(data []byte) ([]byte, error) {
	s, err := scanJSON(data)
	if err != nil {
		return nil, err
	}
	e := emitter{data: data, recs: s.recs, slab: s.slab, buf: make([]byte, 0, s.size)}
	e.value(skipWS(data, 0))
	return e.buf, nil
}

// canonicalDigest writes data's canonical form as the last part of d, without holding it whole:
// through a small buffer. It reports false, writing nothing, when data has none.
func canonicalDigest(d *digest.Digest, data []byte) bool {
	s, err := scanJSON(data)
	if err != nil {
		return false
	}
	d.Part(s.size)
	var buf [16 << 10]byte
	e := emitter{data: data, recs: s.recs, slab: s.slab, buf: buf[:0], d: d}
	e.value(skipWS(data, 0))
	e.flush()
	return true
}

// scan is what the first reading found: the canonical form's size, and for each object whose
// members are out of order a record in slab: its offset in data, the offset after its '}', its
// member count and the offsets of its members' keys in canonical order. recs holds the records'
// positions in slab, ordered by the object's offset.
type scan struct {
	data    []byte
	size    int
	slab    []int32
	recs    []int32
	members []int32 // the keys of the members of the objects being read
	ka, kb  []byte  // scratch for comparing keys with escapes
	order   func(a, b int32) int
}

func scanJSON(data []byte) (*scan, error) {
	if len(data) > 1<<31-1 {
		return nil, fmt.Errorf("%w: it is larger than 2 GiB", errNotCanonicalizable)
	}
	// Decoding invalid UTF-8 would turn different bodies into one; so would a lone surrogate
	// escape, which value refuses.
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: it is not valid UTF-8", errNotCanonicalizable)
	}
	s := &scan{data: data}
	// Key order, and the original order between equal keys: the order is total, so the
	// unstable sort gives the stable result. Made once: a closure per object costs an
	// allocation per object.
	s.order = func(a, b int32) int {
		if c := s.compareKeys(a, b); c != 0 {
			return c
		}
		return int(a - b)
	}
	i, err := s.value(skipWS(data, 0), 0)
	if err != nil {
		return nil, err
	}
	if i = skipWS(data, i); i != len(data) {
		return nil, fmt.Errorf("%w: there is more than one value (offset %d)", errNotCanonicalizable, i)
	}
	slices.SortFunc(s.recs, func(a, b int32) int { return int(s.slab[a] - s.slab[b]) })
	s.members = nil
	return s, nil
}

func syntaxError(i int) error {
	return fmt.Errorf("%w: invalid JSON at offset %d", errNotCanonicalizable, i)
}

// isWS is JSON's whitespace; isSafe the bytes a string holds that its canonical form keeps as
// they are (not '"', '\', a control byte, or 0xE2, which starts U+2028 and U+2029).
var isWS, isSafe [256]bool

func init() {
	for _, c := range " \t\n\r" {
		isWS[c] = true
	}
	for c := 0x20; c < 256; c++ {
		isSafe[c] = c != '"' && c != '\\' && c != 0xE2
	}
}

func skipWS(data []byte, i int) int {
	for i < len(data) && isWS[data[i]] {
		i++
	}
	return i
}

func (s *scan) value(i, depth int) (int, error) {
	data := s.data
	if i >= len(data) {
		return i, syntaxError(i)
	}
	switch c := data[i]; {
	case c == '{':
		if depth >= maxJSONDepth {
			return i, fmt.Errorf("%w: it is nested more than %d deep", errNotCanonicalizable, maxJSONDepth)
		}
		return s.object(i, depth+1)
	case c == '[':
		if depth >= maxJSONDepth {
			return i, fmt.Errorf("%w: it is nested more than %d deep", errNotCanonicalizable, maxJSONDepth)
		}
		s.size++
		i = skipWS(data, i+1)
		if i < len(data) && data[i] == ']' {
			s.size++
			return i + 1, nil
		}
		for {
			var err error
			if i, err = s.value(i, depth+1); err != nil {
				return i, err
			}
			i = skipWS(data, i)
			switch {
			case i < len(data) && data[i] == ',':
				s.size++
				i = skipWS(data, i+1)
			case i < len(data) && data[i] == ']':
				s.size++
				return i + 1, nil
			default:
				return i, syntaxError(i)
			}
		}
	case c == '"':
		end, n, err := scanString(data, i)
		s.size += n
		return end, err
	case c == 't':
		return s.literal(i, "true")
	case c == 'f':
		return s.literal(i, "false")
	case c == 'n':
		return s.literal(i, "null")
	default:
		end, ok := scanNumber(data, i)
		if !ok {
			return i, syntaxError(i)
		}
		s.size += end - i
		return end, nil
	}
}

func (s *scan) literal(i int, word string) (int, error) {
	if !bytes.HasPrefix(s.data[i:], []byte(word)) {
		return i, syntaxError(i)
	}
	s.size += len(word)
	return i + len(word), nil
}

// object reads the object at data[i] ('{'): its members' keys go on s.members while it is
// read, and stay, sorted, in a record when they are out of order.
func (s *scan) object(i, depth int) (int, error) {
	data := s.data
	start := i
	s.size++
	i = skipWS(data, i+1)
	if i < len(data) && data[i] == '}' {
		s.size++
		return i + 1, nil
	}
	base := len(s.members)
	sorted := true
	for {
		if i >= len(data) || data[i] != '"' {
			return i, syntaxError(i)
		}
		end, n, err := scanString(data, i)
		if err != nil {
			return i, err
		}
		s.size += n + 1 // and ':'
		if len(s.members) > base && sorted && s.compareKeys(s.members[len(s.members)-1], int32(i)) > 0 {
			sorted = false
		}
		s.members = append(s.members, int32(i))
		i = skipWS(data, end)
		if i >= len(data) || data[i] != ':' {
			return i, syntaxError(i)
		}
		if i, err = s.value(skipWS(data, i+1), depth); err != nil {
			return i, err
		}
		i = skipWS(data, i)
		switch {
		case i < len(data) && data[i] == ',':
			s.size++
			i = skipWS(data, i+1)
			continue
		case i < len(data) && data[i] == '}':
			s.size++
			i++
		default:
			return i, syntaxError(i)
		}
		break
	}
	if !sorted {
		keys := s.members[base:]
		s.recs = append(s.recs, int32(len(s.slab)))
		s.slab = append(s.slab, int32(start), int32(i), int32(len(keys)))
		s.slab = append(s.slab, keys...)
		slices.SortFunc(s.slab[len(s.slab)-len(keys):], s.order)
	}
	s.members = s.members[:base]
	return i, nil
}

// compareKeys compares the keys whose strings start at offsets a and b by their decoded bytes.
func (s *scan) compareKeys(a, b int32) int {
	ra, rb := rawString(s.data, int(a)), rawString(s.data, int(b))
	if bytes.IndexByte(ra, '\\') < 0 && bytes.IndexByte(rb, '\\') < 0 {
		return bytes.Compare(ra, rb) // no escapes: the raw bytes are the decoded ones
	}
	s.ka = appendDecoded(s.ka[:0], ra)
	s.kb = appendDecoded(s.kb[:0], rb)
	return bytes.Compare(s.ka, s.kb)
}

// rawString returns the text between the quotes of the (valid) string that starts at data[i].
func rawString(data []byte, i int) []byte {
	j := i + 1
	for {
		k := bytes.IndexByte(data[j:], '"')
		j += k
		// The quote closes the string unless an odd number of backslashes precedes it.
		n := 0
		for p := j - 1; p > i && data[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return data[i+1 : j]
		}
		j++
	}
}

// scanString checks the string that starts at data[i] ('"') and returns the offset after it and
// the size of its canonical form, quotes included.
func scanString(data []byte, i int) (end, size int, err error) {
	j := i + 1
	size = 2
	for {
		k := j
		for k < len(data) && isSafe[data[k]] {
			k++
		}
		size += k - j
		if k >= len(data) {
			return k, size, syntaxError(i)
		}
		switch c := data[k]; {
		case c == '"':
			return k + 1, size, nil
		case c == '\\':
			r, n, err := unescape(data, k)
			if err != nil {
				return k, size, err
			}
			size += canonicalRuneSize(r)
			j = k + n
		case c < 0x20:
			return k, size, syntaxError(k)
		default: // 0xE2: U+2028 and U+2029 are escaped, the rest of its runes kept
			if isLineSeparator(data, k) {
				size += 6
			} else {
				size += 3
			}
			j = k + 3 // valid UTF-8: 0xE2 starts a three-byte rune
		}
	}
}

func isLineSeparator(data []byte, k int) bool {
	return k+2 < len(data) && data[k+1] == 0x80 && (data[k+2] == 0xA8 || data[k+2] == 0xA9)
}

// unescape decodes the escape at data[k] ('\') and returns its rune and length. A surrogate
// escape must be half of a high-low pair: a lone half would decode to U+FFFD, as "\ufffd" does.
func unescape(data []byte, k int) (rune, int, error) {
	if k+1 >= len(data) {
		return 0, 0, syntaxError(k)
	}
	switch data[k+1] {
	case '"', '\\', '/':
		return rune(data[k+1]), 2, nil
	case 'b':
		return '\b', 2, nil
	case 'f':
		return '\f', 2, nil
	case 'n':
		return '\n', 2, nil
	case 'r':
		return '\r', 2, nil
	case 't':
		return '\t', 2, nil
	case 'u':
		u, ok := hex4(data, k+2)
		if !ok {
			return 0, 0, syntaxError(k)
		}
		if !utf16.IsSurrogate(u) {
			return u, 6, nil
		}
		if u < 0xdc00 && k+7 < len(data) && data[k+6] == '\\' && data[k+7] == 'u' {
			if low, ok := hex4(data, k+8); ok && low >= 0xdc00 && low <= 0xdfff {
				return utf16.DecodeRune(u, low), 12, nil
			}
		}
		return 0, 0, fmt.Errorf("%w: the escape at offset %d is half of a UTF-16 surrogate pair without the other half", errNotCanonicalizable, k)
	}
	return 0, 0, syntaxError(k)
}

func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// canonicalRuneSize is the size of r in a canonical string.
func canonicalRuneSize(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '\u2028' || r == '\u2029':
		return 6
	}
	return utf8.RuneLen(r)
}

// appendCanonicalRune appends r as a canonical string writes it.
func appendCanonicalRune(buf []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	switch r {
	case '"', '\\':
		return append(buf, '\\', byte(r))
	case '\b':
		return append(buf, '\\', 'b')
	case '\f':
		return append(buf, '\\', 'f')
	case '\n':
		return append(buf, '\\', 'n')
	case '\r':
		return append(buf, '\\', 'r')
	case '\t':
		return append(buf, '\\', 't')
	case '\u2028', '\u2029':
		return append(buf, '\\', 'u', '2', '0', '2', hex[r&0xF])
	}
	if r < 0x20 {
		return append(buf, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xF])
	}
	return utf8.AppendRune(buf, r)
}

// appendDecoded appends the decoded bytes of the raw text of a valid string.
func appendDecoded(buf, raw []byte) []byte {
	for i := 0; i < len(raw); {
		if raw[i] != '\\' {
			buf = append(buf, raw[i])
			i++
			continue
		}
		r, n, _ := unescape(raw, i) // checked by the first reading
		buf = utf8.AppendRune(buf, r)
		i += n
	}
	return buf
}

// scanNumber reads a number as JSON writes one: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(data []byte, i int) (int, bool) {
	digits := func(i int) int {
		for i < len(data) && '0' <= data[i] && data[i] <= '9' {
			i++
		}
		return i
	}
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case i < len(data) && '1' <= data[i] && data[i] <= '9':
		i = digits(i)
	default:
		return i, false
	}
	if i < len(data) && data[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

// emitter writes the canonical form of data, which scanJSON has checked, to buf: whole, or
// through it into d when d is set.
type emitter struct {
	data []byte
	recs []int32
	slab []int32
	buf  []byte
	d    *digest.Digest
}

func (e *emitter) flush() {
	if e.d != nil {
		_, _ = e.d.Write(e.buf)
		e.buf = e.buf[:0]
	}
}

func (e *emitter) write(p []byte) {
	if e.d == nil {
		e.buf = append(e.buf, p...)
		return
	}
	for len(p) > 0 {
		if len(e.buf) == cap(e.buf) {
			e.flush()
		}
		n := copy(e.buf[len(e.buf):cap(e.buf)], p)
		e.buf = e.buf[:len(e.buf)+n]
		p = p[n:]
	}
}

func (e *emitter) writeByte(c byte) {
	if e.d != nil && len(e.buf) == cap(e.buf) {
		e.flush()
	}
	e.buf = append(e.buf, c)
}

// value writes the value at data[i] and returns the offset after it.
func (e *emitter) value(i int) int {
	data := e.data
	switch c := data[i]; {
	case c == '{':
		if rec, ok := e.record(i); ok {
			return e.sortedObject(rec)
		}
		e.writeByte('{')
		i = skipWS(data, i+1)
		for data[i] != '}' {
			i = e.member(i)
			if data[i] == ',' {
				e.writeByte(',')
				i = skipWS(data, i+1)
			}
		}
		e.writeByte('}')
		return i + 1
	case c == '[':
		e.writeByte('[')
		i = skipWS(data, i+1)
		for data[i] != ']' {
			i = skipWS(data, e.value(i))
			if data[i] == ',' {
				e.writeByte(',')
				i = skipWS(data, i+1)
			}
		}
		e.writeByte(']')
		return i + 1
	case c == '"':
		return e.string(i)
	case c == 't':
		e.write(data[i : i+4])
		return i + 4
	case c == 'f':
		e.write(data[i : i+5])
		return i + 5
	case c == 'n':
		e.write(data[i : i+4])
		return i + 4
	default:
		end, _ := scanNumber(data, i)
		e.write(data[i:end])
		return end
	}
}

// member writes the member whose key starts at data[i], and returns the offset after its value
// and the whitespace that follows.
func (e *emitter) member(i int) int {
	i = skipWS(e.data, e.string(i)) // the key, then ':'
	e.writeByte(':')
	return skipWS(e.data, e.value(skipWS(e.data, i+1)))
}

// record finds the record of the object at offset i, if its members are out of order.
func (e *emitter) record(i int) (int32, bool) {
	if len(e.recs) == 0 {
		return 0, false
	}
	// By hand: a comparison closure over e would be allocated on every call.
	lo, hi := 0, len(e.recs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if int(e.slab[e.recs[mid]]) < i {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < len(e.recs) && int(e.slab[e.recs[lo]]) == i {
		return e.recs[lo], true
	}
	return 0, false
}

// sortedObject writes an object's members in the order of its record, and returns the offset
// after the object.
func (e *emitter) sortedObject(rec int32) int {
	end, n := e.slab[rec+1], e.slab[rec+2]
	e.writeByte('{')
	for k, key := range e.slab[rec+3 : rec+3+n] {
		if k > 0 {
			e.writeByte(',')
		}
		e.member(int(key))
	}
	e.writeByte('}')
	return int(end)
}

// string writes the string at data[i] canonically and returns the offset after it.
func (e *emitter) string(i int) int {
	data := e.data
	e.writeByte('"')
	j := i + 1
	for {
		k := j
		for isSafe[data[k]] {
			k++
		}
		e.write(data[j:k])
		switch data[k] {
		case '"':
			e.writeByte('"')
			return k + 1
		case '\\':
			r, n, _ := unescape(data, k)
			var tmp [8]byte
			e.write(appendCanonicalRune(tmp[:0], r))
			j = k + n
		default: // 0xE2
			if isLineSeparator(data, k) {
				e.write([]byte{'\\', 'u', '2', '0', '2', "89"[data[k+2]-0xA8]})
			} else {
				e.write(data[k : k+3])
			}
			j = k + 3
		}
	}
}
