package idemhttp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/digest"
)

// TestCanonicalJSONRandom holds the canonicaliser to the one stored keys' fingerprints were made
// with, on random bodies of the shapes its two readings treat differently: objects in and out of
// order, short and longer than smallSpan (skipped by reading them again, or in one step), nested
// in each other, with whitespace, escapes to keep and to rewrite, U+2028, and duplicate keys.
// The fuzz target explores byte by byte; this builds whole structures it rarely reaches.
func TestCanonicalJSONRandom(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"a", "b", "c", "zz", `\u0061`, `a\n`, `\/x`, "é", "\u2028", `\ud83d\ude00`, "", "key-0001", "key-0002"}
	ws := []string{"", "", "", " ", "\n\t", "  "}
	strs := []string{`"x"`, `"\u00e9"`, `"\"q\""`, `"\u001F"`, `"\u001f"`, "\"\u2029\"", `"` + strings.Repeat("long ", 20) + `"`, `""`}
	var gen func(b *strings.Builder, depth int)
	gen = func(b *strings.Builder, depth int) {
		w := func() { b.WriteString(ws[rng.IntN(len(ws))]) }
		switch k := rng.IntN(10); {
		case depth > 0 && k < 4:
			b.WriteByte('{')
			n := rng.IntN(6)
			for m := range n {
				if m > 0 {
					b.WriteByte(',')
				}
				w()
				fmt.Fprintf(b, `"%s"`, keys[rng.IntN(len(keys))])
				w()
				b.WriteByte(':')
				w()
				gen(b, depth-1)
				w()
			}
			b.WriteByte('}')
		case depth > 0 && k < 6:
			b.WriteByte('[')
			n := rng.IntN(5)
			for m := range n {
				if m > 0 {
					b.WriteByte(',')
				}
				w()
				gen(b, depth-1)
				w()
			}
			b.WriteByte(']')
		case k < 8:
			b.WriteString(strs[rng.IntN(len(strs))])
		default:
			b.WriteString([]string{"1", "-0.5e3", "true", "false", "null", "12345678901234567890"}[rng.IntN(6)])
		}
	}
	for n := range 20000 {
		var b strings.Builder
		gen(&b, 1+n%7)
		data := []byte(b.String())
		old, oldErr := canonicalJSONV0(data)
		got, err := CanonicalJSON(data)
		if (err == nil) != (oldErr == nil) || !bytes.Equal(got, old) {
			t.Fatalf("CanonicalJSON(%q) = %q, %v; the canonicaliser stored keys were made with gave %q, %v", data, got, err, old, oldErr)
		}
		if err != nil {
			continue
		}
		whole, streamed := digest.New(), digest.New()
		whole.Part(len(got))
		_, _ = whole.Write(got)
		if !canonicalDigest(streamed, data) || !bytes.Equal(whole.Sum(), streamed.Sum()) {
			t.Fatalf("canonicalDigest(%q) differs from the digest of %q", data, got)
		}
	}
}

// TestCanonicalJSONLargeBodies: the 1 MiB bodies of the benchmark, whose canonical forms go
// through the digest's buffer many times over, give what the canonicaliser stored keys were
// made with, whole and streamed.
func TestCanonicalJSONLargeBodies(t *testing.T) {
	t.Parallel()
	for name, data := range benchBodies() {
		old, err := canonicalJSONV0(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := CanonicalJSON(data)
		if err != nil || !bytes.Equal(got, old) {
			t.Fatalf("%s: CanonicalJSON differs from the canonicaliser stored keys were made with (%v)", name, err)
		}
		whole, streamed := digest.New(), digest.New()
		whole.Part(len(got))
		_, _ = whole.Write(got)
		if !canonicalDigest(streamed, data) || !bytes.Equal(whole.Sum(), streamed.Sum()) {
			t.Fatalf("%s: canonicalDigest differs from the digest of the canonical form", name)
		}
	}
}

// TestCanonicalJSONShortObjects: objects no longer than smallSpan, out of order, which the
// second reading sorts on the stack, at the most members one can hold and with escaped keys.
func TestCanonicalJSONShortObjects(t *testing.T) {
	t.Parallel()
	most := `{"a":0` + strings.Repeat(`,"":0`, 11) + `}` // 12 members in 62 bytes
	for _, data := range []string{
		most, `[` + most + `,` + most + `]`, `{"b":0,"\u0061":1,"a":2,"\/":3}`, `{"b" : { "z":1 , "y":[2,{"q":0,"p":1}] } , "a":0}`,
		`{"z":"\u2028","a":"\ud83d\ude00"}`, `{"b":{"b":{"b":{"b":0,"a":1},"a":1},"a":1},"a":1}`,
	} {
		old, err := canonicalJSONV0([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		got, err := CanonicalJSON([]byte(data))
		if err != nil || !bytes.Equal(got, old) {
			t.Fatalf("CanonicalJSON(%q) = %q, %v; want %q", data, got, err, old)
		}
	}
	if len(most) > smallSpan {
		t.Fatalf("the object of the most members is %d bytes, longer than smallSpan", len(most))
	}
}
