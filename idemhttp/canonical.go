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

// smallSpan is the longest container (in bytes, brackets included) that the second reading skips
// by reading it again; the first reading records the longer ones, so that skipping them costs a
// lookup however deep or wide they are. Recording only those (12 bytes each, in an array grown by
// doubling) keeps what the record allocates under 24/smallSpan of the body.
const smallSpan = 64

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
// It reads data twice, without building a tree. The first reading checks it, sizes the result,
// notes which objects have their members out of order, and records where the containers longer
// than 64 bytes end. The second writes the result: what is canonical already is copied as it
// is (a body that is canonical as a whole, in one piece), and an object out of order has its
// members' keys gathered and sorted (skipping a recorded container in one step) before they are
// written. It allocates the result, the record, and the keys of the objects out of order on the
// way from the top to the deepest one.
//
//	a, _ := idemhttp.CanonicalJSON([]byte(`{"b": [1, 2], "a": "x"}`))
//	b, _ := idemhttp.CanonicalJSON([]byte(`{"a":"x","b":[1,2]}`))
//	bytes.Equal(a, b) // true: {"a":"x","b":[1,2]}
func CanonicalJSON(data []byte) ([]byte, error) {
	s, err := scanJSON(data)
	if err != nil {
		return nil, err
	}
	if s.clean {
		return bytes.Clone(data), nil
	}
	e := newEmitter(s, make([]byte, 0, s.size), nil)
	e.run()
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
	if s.clean {
		_, _ = d.Write(data)
		return true
	}
	var buf [16 << 10]byte
	e := newEmitter(s, buf[:0], d)
	e.run()
	e.flush()
	return true
}

// scan is what the first reading found.
type scan struct {
	data  []byte
	size  int  // of the canonical form
	clean bool // data is its own canonical form

	// unsorted are the offsets of the objects whose members are out of order, in order.
	unsorted []int32

	// long are the containers longer than smallSpan, by offset.
	long []span

	// keys is the most keys of objects out of order that the second reading holds at once:
	// those of the objects out of order on one path from the top to a leaf.
	keys int

	ka, kb []byte // scratch for comparing keys with escapes
}

// span is a container longer than smallSpan: where it starts and ends, whether its text is
// canonical as it is (the second reading copies it whole), and whether it is an object with a
// key that has escapes (its keys are then compared decoded).
type span struct {
	start, end int32
	clean      bool
	escapes    bool
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
	i := skipWS(data, 0)
	end, v, err := s.value(i, 0)
	if err != nil {
		return nil, err
	}
	clean := v.clean
	s.keys = v.keys
	if j := skipWS(data, end); j != len(data) {
		return nil, fmt.Errorf("%w: there is more than one value (offset %d)", errNotCanonicalizable, j)
	}
	s.clean = clean && i == 0 && end == len(data)
	// Containers were recorded as they closed: the innermost first.
	slices.SortFunc(s.long, func(a, b span) int { return int(a.start - b.start) })
	slices.Sort(s.unsorted)
	return s, nil
}

func syntaxError(i int) error {
	return fmt.Errorf("%w: invalid JSON at offset %d", errNotCanonicalizable, i)
}

// isWS is JSON's whitespace; isSafe the bytes a string holds that its canonical form keeps as
// they are (not '"', '\', a control byte, or 0xE2, which starts U+2028 and U+2029).
var isWS, isSafe, isNumber [256]bool

func init() {
	for _, c := range "0123456789+-.eE" {
		isNumber[c] = true
	}
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

// valueInfo is what the first reading found of a value: whether its text is canonical as it is,
// and how many keys the second reading gathers at most while it writes it (see scan.keys).
type valueInfo struct {
	clean bool
	keys  int
}

var cleanScalar = valueInfo{clean: true}

// value reads the value at data[i], which is not whitespace, and returns the offset after it.
func (s *scan) value(i, depth int) (int, valueInfo, error) {
	data := s.data
	if i >= len(data) {
		return i, valueInfo{}, syntaxError(i)
	}
	switch c := data[i]; {
	case c == '{' || c == '[':
		if depth >= maxJSONDepth {
			return i, valueInfo{}, fmt.Errorf("%w: it is nested more than %d deep", errNotCanonicalizable, maxJSONDepth)
		}
		if c == '{' {
			return s.object(i, depth+1)
		}
		return s.array(i, depth+1)
	case c == '"':
		end, size, flags, err := scanString(data, i)
		s.size += size
		return end, valueInfo{clean: flags&strDirty == 0}, err
	case c == 't':
		return s.literal(i, "true")
	case c == 'f':
		return s.literal(i, "false")
	case c == 'n':
		return s.literal(i, "null")
	default:
		end, ok := scanNumber(data, i)
		if !ok {
			return i, valueInfo{}, syntaxError(i)
		}
		s.size += end - i
		return end, cleanScalar, nil
	}
}

func (s *scan) literal(i int, word string) (int, valueInfo, error) {
	if !bytes.HasPrefix(s.data[i:], []byte(word)) {
		return i, valueInfo{}, syntaxError(i)
	}
	s.size += len(word)
	return i + len(word), cleanScalar, nil
}

// ws skips whitespace at data[i], and clears clean if there is any.
func (s *scan) ws(i int, clean *bool) int {
	if i < len(s.data) && isWS[s.data[i]] {
		*clean = false
		return skipWS(s.data, i)
	}
	return i
}

func (s *scan) array(i, depth int) (int, valueInfo, error) {
	data := s.data
	start := i
	a := valueInfo{clean: true}
	s.size++
	i = s.ws(i+1, &a.clean)
	if i < len(data) && data[i] == ']' {
		s.size++
		return i + 1, a, nil
	}
	for {
		end, v, err := s.value(i, depth)
		if err != nil {
			return end, valueInfo{}, err
		}
		a.clean = a.clean && v.clean
		a.keys = max(a.keys, v.keys)
		i = s.ws(end, &a.clean)
		switch {
		case i < len(data) && data[i] == ',':
			s.size++
			i = s.ws(i+1, &a.clean)
		case i < len(data) && data[i] == ']':
			s.size++
			i++
			s.note(start, i, a.clean, false)
			return i, a, nil
		default:
			return i, valueInfo{}, syntaxError(i)
		}
	}
}

// object reads the object at data[i] ('{'), noting whether its members are in order by
// comparing each key with the one before.
func (s *scan) object(i, depth int) (int, valueInfo, error) {
	data := s.data
	start := i
	clean, keys := true, 0 // keys: the most any member's value gathers
	s.size++
	i = s.ws(i+1, &clean)
	if i < len(data) && data[i] == '}' {
		s.size++
		return i + 1, valueInfo{clean: clean}, nil
	}
	sorted, members, escapes := true, 0, false
	var prev stringInfo
	for {
		if i >= len(data) || data[i] != '"' {
			return i, valueInfo{}, syntaxError(i)
		}
		kend, ksize, kflags, err := scanString(data, i)
		if err != nil {
			return i, valueInfo{}, err
		}
		s.size += ksize + 1 // and ':'
		clean = clean && kflags&strDirty == 0
		key := stringInfo{start: i, end: kend, escaped: kflags&strEscaped != 0}
		escapes = escapes || key.escaped
		if members > 0 && sorted && s.compareScanned(prev, key) > 0 {
			sorted = false
		}
		prev = key
		members++
		i = s.ws(kend, &clean)
		if i >= len(data) || data[i] != ':' {
			return i, valueInfo{}, syntaxError(i)
		}
		end, v, err := s.value(s.ws(i+1, &clean), depth)
		if err != nil {
			return end, valueInfo{}, err
		}
		clean = clean && v.clean
		keys = max(keys, v.keys)
		i = s.ws(end, &clean)
		switch {
		case i < len(data) && data[i] == ',':
			s.size++
			i = s.ws(i+1, &clean)
			continue
		case i < len(data) && data[i] == '}':
			s.size++
			i++
		default:
			return i, valueInfo{}, syntaxError(i)
		}
		break
	}
	if !sorted {
		s.unsorted = grow(s.unsorted)
		s.unsorted = append(s.unsorted, int32(start))
		keys += members // gathered while its values are written
	}
	s.note(start, i, clean && sorted, escapes)
	return i, valueInfo{clean: clean && sorted, keys: keys}, nil
}

// grow makes room for one more element by doubling, so that what the records allocate is at most
// twice what they hold (append grows a large slice by a quarter, and would allocate several times
// what it holds on the way).
func grow[T any](list []T) []T {
	if len(list) < cap(list) {
		return list
	}
	return append(make([]T, 0, max(16, 2*cap(list))), list...)
}

// note records the container data[start:end] if it is longer than smallSpan.
func (s *scan) note(start, end int, clean, escapes bool) {
	if end-start <= smallSpan {
		return
	}
	s.long = grow(s.long)
	s.long = append(s.long, span{start: int32(start), end: int32(end), clean: clean, escapes: escapes})
}

// compareScanned compares two keys by their decoded bytes.
func (s *scan) compareScanned(a, b stringInfo) int {
	ra, rb := s.data[a.start+1:a.end-1], s.data[b.start+1:b.end-1]
	if !a.escaped && !b.escaped {
		return bytes.Compare(ra, rb) // no escapes: the raw bytes are the decoded ones
	}
	s.ka = appendDecoded(s.ka[:0], ra)
	s.kb = appendDecoded(s.kb[:0], rb)
	return bytes.Compare(s.ka, s.kb)
}

// stringInfo is a key as the first reading keeps it, to compare the next key with.
type stringInfo struct {
	start, end int  // offsets of its opening quote and after its closing one
	escaped    bool // it has escapes
}

// What scanString found of a string besides its end and size: it has escapes; its text is its
// canonical form.
const (
	strEscaped = 1 << iota
	strDirty
)

// scanString checks the string that starts at data[i] ('"'), and returns the offset after it,
// the size of its canonical form (quotes included) and what it found (strEscaped, strDirty).
// Results rather than a struct: they travel in registers, on the path every key and string takes.
func scanString(data []byte, i int) (end, size int, flags uint8, err error) {
	size = 2
	j := i + 1
	for {
		k := j
		for k < len(data) && isSafe[data[k]] {
			k++
		}
		size += k - j
		if k >= len(data) {
			return k, size, flags, syntaxError(i)
		}
		switch c := data[k]; {
		case c == '"':
			return k + 1, size, flags, nil
		case c == '\\':
			r, n, err := unescape(data, k)
			if err != nil {
				return k, size, flags, err
			}
			var tmp [8]byte
			canon := appendCanonicalRune(tmp[:0], r)
			size += len(canon)
			flags |= strEscaped
			if !bytes.Equal(canon, data[k:k+n]) {
				flags |= strDirty
			}
			j = k + n
		case c < 0x20:
			return k, size, flags, syntaxError(k)
		default: // 0xE2: U+2028 and U+2029 are escaped, the rest of its runes kept
			if isLineSeparator(data, k) {
				size += 6
				flags |= strDirty
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
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case i < len(data) && '1' <= data[i] && data[i] <= '9':
		i = digitsEnd(data, i)
	default:
		return i, false
	}
	if i < len(data) && data[i] == '.' {
		j := digitsEnd(data, i+1)
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
		j := digitsEnd(data, i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

func digitsEnd(data []byte, i int) int {
	for i < len(data) && '0' <= data[i] && data[i] <= '9' {
		i++
	}
	return i
}

// numberEnd returns the offset after the (valid) number at data[i].
func numberEnd(data []byte, i int) int {
	for i < len(data) && isNumber[data[i]] {
		i++
	}
	return i
}

// emitter writes the canonical form of data, which scanJSON has checked, to buf: whole, or
// through it into d when d is set. What is canonical already is not copied token by token: the
// input from offset from on is pending, and goes out in one piece when something must change
// (whitespace dropped, an escape rewritten, members reordered) or the end is reached.
type emitter struct {
	*scan
	buf        []byte
	d          *digest.Digest
	from       int // data[from:] up to where the emitter is is pending: it goes out as it is
	longStarts offsets
	unsortedAt offsets
	members    []uint64
	spare      []uint64 // sortPrefixes' second array
	byKey      func(a, b uint64) int
}

// A member of an object out of order, as the second reading gathers it, is a uint64: the offset
// of its key, below 4 bytes of the key that sortMembers puts there.

func memberKey(m uint64) int       { return int(uint32(m)) }
func memberPrefix(m uint64) uint32 { return uint32(m >> 32) }

func newEmitter(s *scan, buf []byte, d *digest.Digest) *emitter {
	e := &emitter{scan: s, buf: buf, d: d, unsortedAt: offsets{at: s.unsorted}}
	if len(s.long) > 0 {
		e.longStarts.at = make([]int32, len(s.long))
		for k, l := range s.long {
			e.longStarts.at[k] = l.start
		}
	}
	// Key order, and the original order between equal keys: the order is total, so the
	// unstable sort gives the stable result. Made once: a closure per object would be an
	// allocation per object.
	e.byKey = func(a, b uint64) int {
		if c := e.compareKeys(int32(memberKey(a)), int32(memberKey(b))); c != 0 {
			return c
		}
		return memberKey(a) - memberKey(b)
	}
	return e
}

// run writes the canonical form of the whole body.
func (e *emitter) run() {
	i := skipWS(e.data, 0)
	e.from = i
	end := e.value(i)
	e.flushTo(end)
}

func (e *emitter) flush() {
	if e.d != nil {
		_, _ = e.d.Write(e.buf)
		e.buf = e.buf[:0]
	}
}

func (e *emitter) write(p []byte) {
	if e.d == nil || len(e.buf)+len(p) <= cap(e.buf) {
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

// flushTo writes the pending input up to offset i.
func (e *emitter) flushTo(i int) {
	if i > e.from {
		e.write(e.data[e.from:i])
	}
	e.from = i
}

// ws drops whitespace at data[i] from the output and returns the offset after it.
func (e *emitter) ws(i int) int {
	if isWS[e.data[i]] {
		e.flushTo(i)
		i = skipWS(e.data, i)
		e.from = i
	}
	return i
}

// offsets finds offsets in a sorted list. The second reading asks in document order, mostly, so
// the one after the last found is tried first.
type offsets struct {
	at   []int32
	next int
}

// find returns the index of offset i in the list, and whether it is there.
func (o *offsets) find(i int) (int, bool) {
	at, n := o.at, o.next
	if n < len(at) && int(at[n]) == i {
		o.next = n + 1
		return n, true
	}
	if (n == len(at) || int(at[n]) > i) && (n == 0 || int(at[n-1]) < i) {
		return 0, false // between two offsets of the list
	}
	n, found := slices.BinarySearch(at, int32(i))
	o.next = n
	if found {
		o.next++
	}
	return n, found
}

// longAt finds the record of the container at offset i, nil if it is no longer than smallSpan.
func (e *emitter) longAt(i int) *span {
	if k, ok := e.longStarts.find(i); ok {
		return &e.long[k]
	}
	return nil
}

// isUnsorted reports whether the object at offset i has its members out of order.
func (e *emitter) isUnsorted(i int) bool {
	_, ok := e.unsortedAt.find(i)
	return ok
}

// value writes the value at data[i] and returns the offset after it.
func (e *emitter) value(i int) int {
	data := e.data
	switch c := data[i]; {
	case c == '{':
		return e.object(i)
	case c == '[':
		if l := e.longAt(i); l != nil && l.clean {
			return int(l.end)
		}
		i = e.ws(i + 1)
		for data[i] != ']' {
			i = e.ws(e.value(i))
			if data[i] == ',' {
				i = e.ws(i + 1)
			}
		}
		return i + 1
	case c == '"':
		return e.string(i)
	case c == 't', c == 'n':
		return i + 4
	case c == 'f':
		return i + 5
	default:
		return numberEnd(data, i)
	}
}

// object writes the object at data[i]: in document order when its members are in order, else
// by gathering their keys and sorting them.
func (e *emitter) object(i int) int {
	data := e.data
	l := e.longAt(i)
	if l != nil && l.clean {
		return int(l.end)
	}
	if !e.isUnsorted(i) {
		i = e.ws(i + 1)
		for data[i] != '}' {
			i = e.member(i)
			if data[i] == ',' {
				i = e.ws(i + 1)
			}
		}
		return i + 1
	}
	if l == nil {
		return e.shortObject(i)
	}

	base := len(e.members)
	if e.members == nil {
		e.members = make([]uint64, 0, e.keys) // the most gathered at once: never grown
	}
	j := skipWS(data, i+1)
	for {
		e.members = append(e.members, uint64(j))
		v := skipWS(data, stringEnd(data, j))
		j = skipWS(data, e.skip(skipWS(data, v+1)))
		if data[j] != ',' {
			break
		}
		j = skipWS(data, j+1)
	}
	end := j + 1
	keys := e.members[base:]
	e.sortMembers(keys, l.escapes)
	e.flushTo(i + 1) // through '{'
	for k, m := range keys {
		if k > 0 {
			e.writeByte(',')
		}
		e.from = memberKey(m)
		e.flushTo(e.member(memberKey(m)))
	}
	e.writeByte('}')
	e.from = end
	e.members = e.members[:base]
	return end
}

// sortMembers sorts members by key, and members with equal keys by offset, as a radix sort on
// 4 bytes of key at a time: each round puts 4 bytes above the offsets and sorts integers, and
// only runs that agree on all 4 bytes, and go on, are sorted on the next 4. The bytes all the keys
// share are skipped first. Comparing whole keys (the comparison decodes escapes) is left for
// objects with an escaped key (escapes), and for runs that share more than maxRadixBytes beyond
// that.
func (e *emitter) sortMembers(keys []uint64, escapes bool) {
	if escapes {
		slices.SortFunc(keys, e.byKey)
		return
	}
	// The bytes all keys share: each key is read only as far as it agrees with the first.
	data := e.data
	first := memberKey(keys[0]) + 1
	shared := stringEnd(data, first-1) - 1 - first
	for _, m := range keys[1:] {
		k := memberKey(m) + 1
		n := 0
		for n < shared && data[k+n] == data[first+n] {
			n++
		}
		shared = n
	}
	e.radix(keys, shared, shared+maxRadixBytes)
}

// maxRadixBytes bounds how far into their keys sortMembers goes by radix.
const maxRadixBytes = 64

func (e *emitter) radix(keys []uint64, at, limit int) {
	if at >= limit {
		slices.SortFunc(keys, e.byKey)
		return
	}
	data := e.data
	for k, m := range keys {
		// The keys have no escapes, so the first '"' ends one; each is at least at bytes long
		// (it agreed with the others on the bytes before, and went on).
		var p uint32
		ended := false
		for b, c := 0, memberKey(m)+1+at; b < 4; b, c = b+1, c+1 {
			p <<= 8 // a key that ends sooner pads with zero, below any byte it can hold
			if ended = ended || data[c] == '"'; !ended {
				p |= uint32(data[c])
			}
		}
		keys[k] = uint64(p)<<32 | uint64(uint32(m))
	}
	e.sortPrefixes(keys)
	for a := 0; a < len(keys); {
		b := a + 1
		for b < len(keys) && memberPrefix(keys[b]) == memberPrefix(keys[a]) {
			b++
		}
		// Keys that agree on these 4 bytes and end in them are equal, and in offset order.
		if b-a > 1 && memberPrefix(keys[a])&0xff != 0 {
			e.radix(keys[a:b], at+4, limit)
		}
		a = b
	}
}

// sortPrefixes sorts members by their 4 bytes of key, keeping the order of offsets among equal
// ones. They come in offset order (each round keeps it, and the first has it from the document),
// so a stable sort on the bytes alone is the order wanted: an LSD radix sort, a byte at a time,
// through a second array of members, when the two arrays together take at most the body's size;
// else the members are sorted as integers, whose low half (the offset) breaks the ties.
func (e *emitter) sortPrefixes(keys []uint64) {
	// In order already, or in reverse order: one reading, as pdqsort would notice. Reversed,
	// the members with equal bytes are reversed back, to keep their offsets in order.
	up, down := true, true
	for k := 1; k < len(keys) && (up || down); k++ {
		a, b := memberPrefix(keys[k-1]), memberPrefix(keys[k])
		up = up && a <= b
		down = down && a >= b
	}
	switch {
	case up:
		return
	case down:
		slices.Reverse(keys)
		for a := 0; a < len(keys); {
			b := a + 1
			for b < len(keys) && memberPrefix(keys[b]) == memberPrefix(keys[a]) {
				b++
			}
			slices.Reverse(keys[a:b])
			a = b
		}
		return
	}
	if len(keys) < 64 || 16*len(e.members) > len(e.data) {
		slices.Sort(keys)
		return
	}
	if e.spare == nil {
		e.spare = make([]uint64, cap(e.members))
	}
	from, to := keys, e.spare[:len(keys)]
	for shift := 32; shift < 64; shift += 8 {
		var count [256]int
		for _, m := range from {
			count[byte(m>>shift)]++
		}
		if count[byte(from[0]>>shift)] == len(from) {
			continue // every member has this byte: the pass would change nothing
		}
		at := 0
		for b, n := range count {
			count[b] = at
			at += n
		}
		for _, m := range from {
			d := byte(m >> shift)
			to[count[d]] = m
			count[d]++
		}
		from, to = to, from
	}
	if &from[0] != &keys[0] {
		copy(keys, from)
	}
}

// shortMember is a member of an object no longer than smallSpan, as shortObject gathers it.
type shortMember struct {
	key, keyEnd, value int32
	escaped            bool // the key has escapes
}

// shortObject writes an object out of order that is no longer than smallSpan (so it has at most
// (smallSpan-2)/5 members, each at least `"":0,`): its members are gathered on the stack,
// sorted by insertion, and written each in one piece when its text is canonical already.
func (e *emitter) shortObject(i int) int {
	data := e.data
	var ms [(smallSpan - 2) / 5]shortMember
	n := 0
	j := skipWS(data, i+1)
	for {
		// The key's end, and whether it has escapes, in one reading of a short key.
		ke, escaped := j+1, false
		for ; data[ke] != '"'; ke++ {
			if data[ke] == '\\' {
				escaped = true
				ke++
			}
		}
		ke++
		v := skipWS(data, skipWS(data, ke)+1)
		ms[n] = shortMember{key: int32(j), keyEnd: int32(ke), value: int32(v), escaped: escaped}
		n++
		j = skipWS(data, e.skip(v))
		if data[j] != ',' {
			break
		}
		j = skipWS(data, j+1)
	}
	end := j + 1
	for a := 1; a < n; a++ { // by key, then by position: stable
		for b := a; b > 0 && e.compareShort(&ms[b-1], &ms[b]) > 0; b-- {
			ms[b-1], ms[b] = ms[b], ms[b-1]
		}
	}
	e.flushTo(i + 1) // through '{'
	for k := range ms[:n] {
		m := &ms[k]
		if k > 0 {
			e.writeByte(',')
		}
		e.from = int(m.key)
		ke := e.string(int(m.key))
		if data[ke] != ':' || int(m.value) != ke+1 {
			e.flushTo(ke)
			e.writeByte(':')
			e.from = int(m.value)
		}
		e.flushTo(e.value(int(m.value)))
	}
	e.writeByte('}')
	e.from = end
	return end
}

// compareShort compares two gathered keys by their decoded bytes; equal keys keep their order.
func (e *emitter) compareShort(a, b *shortMember) int {
	ra, rb := e.data[a.key+1:a.keyEnd-1], e.data[b.key+1:b.keyEnd-1]
	var c int
	if !a.escaped && !b.escaped {
		c = bytes.Compare(ra, rb)
	} else {
		e.ka = appendDecoded(e.ka[:0], ra)
		e.kb = appendDecoded(e.kb[:0], rb)
		c = bytes.Compare(e.ka, e.kb)
	}
	if c != 0 {
		return c
	}
	return int(a.key - b.key)
}

// member writes the member whose key starts at data[i], and returns the offset after its value
// and the whitespace that follows.
func (e *emitter) member(i int) int {
	i = e.ws(e.string(i)) // the key, then ':'
	return e.ws(e.value(e.ws(i + 1)))
}

// skip returns the offset after the value at data[i], without writing it: a recorded container
// in one step, a short one by reading it again.
func (e *emitter) skip(i int) int {
	data := e.data
	switch c := data[i]; {
	case c == '{' || c == '[':
		if l := e.longAt(i); l != nil {
			return int(l.end)
		}
		depth := 0
		for ; ; i++ {
			switch data[i] {
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			case '"':
				i = stringEnd(data, i) - 1
			}
		}
	case c == '"':
		return stringEnd(data, i)
	case c == 't', c == 'n':
		return i + 4
	case c == 'f':
		return i + 5
	default:
		return numberEnd(data, i)
	}
}

// string writes the string at data[i] canonically and returns the offset after it.
func (e *emitter) string(i int) int {
	data := e.data
	j := i + 1
	for {
		k := j
		for isSafe[data[k]] {
			k++
		}
		switch data[k] {
		case '"':
			return k + 1
		case '\\':
			r, n, _ := unescape(data, k)
			var tmp [8]byte
			if canon := appendCanonicalRune(tmp[:0], r); !bytes.Equal(canon, data[k:k+n]) {
				e.flushTo(k)
				e.write(canon)
				e.from = k + n
			}
			j = k + n
		default: // 0xE2
			if isLineSeparator(data, k) {
				e.flushTo(k)
				e.write([]byte{'\\', 'u', '2', '0', '2', "89"[data[k+2]-0xA8]})
				e.from = k + 3
			}
			j = k + 3
		}
	}
}

// keyText returns the text between the quotes of the (valid) string that starts at data[i], and
// whether it has escapes. Keys are short, mostly: a loop over their bytes costs less than a call
// of bytes.IndexByte, which a long one gets.
func keyText(data []byte, i int) ([]byte, bool) {
	escaped := false
	for k := i + 1; k < i+32; k++ {
		switch data[k] {
		case '"':
			return data[i+1 : k], escaped
		case '\\':
			escaped = true
			k++
		}
	}
	raw := data[i+1 : stringEnd(data, i)-1]
	return raw, escaped || bytes.IndexByte(raw, '\\') >= 0
}

// stringEnd returns the offset after the (valid) string that starts at data[i].
func stringEnd(data []byte, i int) int {
	j := i + 1
	for {
		j += bytes.IndexByte(data[j:], '"')
		// The quote closes the string unless an odd number of backslashes precedes it.
		n := 0
		for p := j - 1; p > i && data[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		j++
	}
}

// compareKeys compares the keys whose strings start at offsets a and b by their decoded bytes.
func (e *emitter) compareKeys(a, b int32) int {
	data := e.data
	ra, ea := keyText(data, int(a))
	rb, eb := keyText(data, int(b))
	if !ea && !eb {
		return bytes.Compare(ra, rb) // no escapes: the raw bytes are the decoded ones
	}
	e.ka = appendDecoded(e.ka[:0], ra)
	e.kb = appendDecoded(e.kb[:0], rb)
	return bytes.Compare(e.ka, e.kb)
}
