package idemhttp

import (
	"fmt"
	"strings"

	"github.com/idemkit/idem"
)

// DefaultKeyHeader is the request header that carries the idempotency key, as named by
// draft-ietf-httpapi-idempotency-key-header and by Stripe.
const DefaultKeyHeader = "Idempotency-Key"

// DefaultReplayedHeader is the response header set to "true" on a replayed response, as Stripe
// names it. The IETF draft does not name one.
const DefaultReplayedHeader = "Idempotent-Replayed"

// ParseKey parses the value of an Idempotency-Key header field and returns the key it carries.
//
// Two forms are accepted, so that clients of either convention work unchanged:
//
//   - The IETF draft's form, a Structured Field string (RFC 8941): "8e03978e-40d5-43e8".
//     Escapes (\" and \\) are decoded; parameters after the string are refused, because the draft
//     defines none and ignoring them would let two different field values name the same key.
//   - Stripe's bare form: 8e03978e-40d5-43e8, taken as is. A value that begins with a quote is
//     read as the quoted form, so a bare key cannot begin with one.
//
// The key itself must pass [idem.ValidateID] (1–255 bytes of printable ASCII, no spaces). Every
// error wraps [idem.ErrInvalidKey] and says what is wrong.
//
//	id, err := idemhttp.ParseKey(r.Header.Get("Idempotency-Key"))
//	if err != nil {
//		http.Error(w, err.Error(), http.StatusBadRequest)
//		return
//	}
func ParseKey(value string) (string, error) {
	value = strings.Trim(value, " \t")
	if !strings.HasPrefix(value, `"`) {
		return validated(value)
	}
	var b strings.Builder
	for i := 1; i < len(value); i++ {
		switch c := value[i]; {
		case c == '\\':
			if i+1 >= len(value) || (value[i+1] != '"' && value[i+1] != '\\') {
				return "", fmt.Errorf("%w: the quoted key has a backslash at offset %d that is not followed by \\ or \"", idem.ErrInvalidKey, i)
			}
			i++
			b.WriteByte(value[i])
		case c == '"':
			if rest := strings.TrimRight(value[i+1:], " \t"); rest != "" {
				// Quoted in part only: the rest of the field can be as long as the header limit.
				if rest[0] == ';' {
					return "", fmt.Errorf("%w: the key has parameters (%q), which this server does not accept; send the quoted key alone", idem.ErrInvalidKey, excerpt(rest))
				}
				return "", fmt.Errorf("%w: the quoted key is followed by %q; send one quoted string", idem.ErrInvalidKey, excerpt(rest))
			}
			return validated(b.String())
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: the quoted key has byte 0x%02x at offset %d; only printable ASCII is allowed", idem.ErrInvalidKey, c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: the quoted key has no closing quote", idem.ErrInvalidKey)
}

func validated(id string) (string, error) {
	if err := idem.ValidateID(id); err != nil {
		return "", err
	}
	return id, nil
}

// formatKey renders id in the draft's Structured Field string form.
func formatKey(id string) string {
	if !strings.ContainsAny(id, `"\`) {
		return `"` + id + `"`
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(id) + `"`
}
