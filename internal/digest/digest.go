// Package digest is the construction behind idem.Fingerprint, as a stream: SHA-256 over a fixed
// label and each part preceded by its length. idemhttp writes a canonicalised JSON body into it
// as it produces it, so that the body is never held twice; idem.Fingerprint writes whole parts.
// Both must give the same bytes for the same parts, since stored keys compare fingerprints.
package digest

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
)

// label starts every fingerprint; changing it changes every stored key's fingerprint.
const label = "idem.fingerprint.v1"

// Digest is a fingerprint being written.
type Digest struct{ h hash.Hash }

// New starts a fingerprint.
func New() *Digest {
	d := &Digest{h: sha256.New()}
	d.h.Write([]byte(label))
	return d
}

// Part starts a part of n bytes; exactly n bytes must be written before the next part.
func (d *Digest) Part(n int) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	d.h.Write(b[:])
}

// Write adds bytes of the current part.
func (d *Digest) Write(p []byte) (int, error) { return d.h.Write(p) }

// WriteString adds bytes of the current part.
func (d *Digest) WriteString(s string) { _, _ = d.h.Write([]byte(s)) }

// Sum returns the fingerprint.
func (d *Digest) Sum() []byte { return d.h.Sum(nil) }
