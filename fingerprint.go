package idem

import (
	"crypto/sha256"
	"encoding/binary"
)

// Fingerprint digests the parts of a request into a value for Key.Fingerprint: SHA-256 over each
// part preceded by its length, so ("ab", "c") and ("a", "bc") differ. Put in every part that
// makes two requests different (method, path, the fields of the body); leave out what may
// change between retries of the same request (timestamps, tracing headers).
//
//	key.Fingerprint = idem.Fingerprint("transfer", req.From, req.To, strconv.FormatInt(req.Amount, 10))
func Fingerprint[P ~string | ~[]byte](parts ...P) []byte {
	h := sha256.New()
	h.Write([]byte("idem.fingerprint.v1"))
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return h.Sum(nil)
}
