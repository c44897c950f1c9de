package idem

import (
	"fmt"
	"unicode/utf8"
)

// MaxKeyLength is the longest Key.ID and Key.Scope accepted, in bytes.
const MaxKeyLength = 255

// Key names one idempotent operation.
//
// Scope is the tenant or principal the key belongs to: two scopes never see each other's keys,
// so a client cannot replay (or block) another client's operation by guessing its key. ID is
// chosen by the client, typically a UUID sent with each logical request and reused on every
// retry of it. Fingerprint is a digest of the request (see [Fingerprint]); when both the stored
// and the presented fingerprint are set and differ, the request is rejected with [ErrMismatch]
// instead of being answered with another request's result. A nil Fingerprint means "do not
// check".
//
//	key := idem.Key{
//		Scope:       "customer:42",
//		ID:          r.Header.Get("Idempotency-Key"),
//		Fingerprint: idem.Fingerprint(r.Method, r.URL.Path, string(body)),
//	}
type Key struct {
	Scope       string // tenant or principal; required
	ID          string // client-chosen, 1–255 bytes of printable ASCII (0x21–0x7E)
	Fingerprint []byte // digest of the request; nil means "do not check"
}

// Validate reports whether k is well formed, without touching the database. The error wraps
// [ErrInvalidKey] and says what is wrong.
//
//	if err := key.Validate(); err != nil {
//		http.Error(w, err.Error(), http.StatusBadRequest)
//	}
func (k Key) Validate() error {
	if err := validateScope(k.Scope); err != nil {
		return err
	}
	return ValidateID(k.ID)
}

// ValidateID reports whether id is acceptable as Key.ID: 1 to 255 bytes, each printable ASCII
// (0x21–0x7E, so no space, control byte or non-ASCII). The error wraps [ErrInvalidKey].
//
//	if err := idem.ValidateID(header); err != nil { ... } // 400 Bad Request
func ValidateID(id string) error {
	switch {
	case id == "":
		return invalidKey("ID cannot be empty: send a unique key, such as a UUID, with each request")
	case len(id) > MaxKeyLength:
		return invalidKey(fmt.Sprintf("ID is %d bytes; it cannot be longer than %d bytes", len(id), MaxKeyLength))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return invalidKey(fmt.Sprintf("ID has byte 0x%02x at offset %d; only printable ASCII (0x21-0x7E, no spaces) is allowed", c, i))
		}
	}
	return nil
}

func validateScope(scope string) error {
	switch {
	case scope == "":
		return invalidKey("Scope cannot be empty: set it to the tenant or principal the key belongs to")
	case len(scope) > MaxKeyLength:
		return invalidKey(fmt.Sprintf("Scope is %d bytes; it cannot be longer than %d bytes", len(scope), MaxKeyLength))
	case !utf8.ValidString(scope):
		return invalidKey("Scope is not valid UTF-8")
	}
	for i, r := range scope {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return invalidKey(fmt.Sprintf("Scope has control character %U at offset %d", r, i))
		}
	}
	return nil
}

// InvalidKeyError is returned for a malformed Key. errors.Is(err, ErrInvalidKey) holds for it.
//
//	var bad *idem.InvalidKeyError
//	if errors.As(err, &bad) {
//		http.Error(w, "Idempotency-Key: "+bad.Reason, http.StatusBadRequest)
//	}
type InvalidKeyError struct {
	Reason string // what is wrong, as a sentence fragment naming the field
}

func invalidKey(reason string) error { return &InvalidKeyError{Reason: reason} }

// Error implements error.
func (e *InvalidKeyError) Error() string { return "idem: invalid key: " + e.Reason }

// Is makes errors.Is(err, ErrInvalidKey) true.
func (e *InvalidKeyError) Is(target error) bool { return target == ErrInvalidKey }
