package idem_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/idemkit/idem"
)

// FuzzValidateID checks ValidateID against the rule it implements, written the slow, obvious way.
func FuzzValidateID(f *testing.F) {
	for _, s := range []string{"", "a", "0190a7f4-6f1c-7cc2-b1a4-1c1f0a0c9d5e", "a b", "caf\u00e9", "\x00", "\x7f", "~!", string(bytes.Repeat([]byte{'x'}, 256))} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		want := len(id) >= 1 && len(id) <= 255
		for _, c := range []byte(id) {
			if c < 0x21 || c > 0x7e {
				want = false
			}
		}
		err := idem.ValidateID(id)
		if want != (err == nil) {
			t.Fatalf("ValidateID(%q) = %v, want valid=%v", id, err, want)
		}
		if err != nil && !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("ValidateID(%q) error %v does not wrap ErrInvalidKey", id, err)
		}
		if err := (idem.Key{Scope: "s", ID: id}).Validate(); want != (err == nil) {
			t.Fatalf("Key.Validate disagrees with ValidateID for %q", id)
		}
	})
}

// FuzzFingerprint checks that moving the boundary between parts changes the fingerprint, and
// that equal parts give equal fingerprints whether passed as strings or bytes.
func FuzzFingerprint(f *testing.F) {
	f.Add("ab", "c", "a", "bc")
	f.Add("", "x", "x", "")
	f.Add("same", "same", "same", "same")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		x, y := idem.Fingerprint(a, b), idem.Fingerprint(c, d)
		if (a == c && b == d) != bytes.Equal(x, y) {
			t.Fatalf("Fingerprint(%q,%q) vs (%q,%q): equal=%v", a, b, c, d, bytes.Equal(x, y))
		}
		if !bytes.Equal(x, idem.Fingerprint([]byte(a), []byte(b))) {
			t.Fatal("string and []byte parts disagree")
		}
		if len(x) != 32 {
			t.Fatalf("fingerprint is %d bytes, want 32", len(x))
		}
		if bytes.Equal(idem.Fingerprint(a+b), x) {
			t.Fatalf("one part %q collides with two parts (%q,%q)", a+b, a, b)
		}
	})
}
