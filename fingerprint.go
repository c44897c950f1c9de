package idem

import "github.com/idemkit/idem/internal/digest"

// Fingerprint digests the parts of a request into a value for Key.Fingerprint: SHA-256 over each
// part preceded by its length, so ("ab", "c") and ("a", "bc") differ. Put in every part that
// makes two requests different (method, path, the fields of the body); leave out what may
// change between retries of the same request (timestamps, tracing headers).
//
//	key.Fingerprint = idem.Fingerprint("transfer", req.From, req.To, strconv.FormatInt(req.Amount, 10))
func Fingerprint[P ~string | ~[]byte](parts ...P) []byte {
	d := digest.New()
	for _, p := range parts {
		d.Part(len(p))
		_, _ = d.Write([]byte(p))
	}
	return d.Sum()
}
