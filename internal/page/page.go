// Package page is what idem's listings (idem.KeyList, workflow.Engine.RunList) share: a page size
// checked the same way, and cursors that are base64url JSON, opaque to callers.
package page

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
)

// Limit returns the page size a listing was asked for: def for 0, and an error that names field
// (as "idem: KeyListParams.Limit") for a negative one or one over most.
func Limit(field string, limit, def, most int) (int, error) {
	switch {
	case limit < 0:
		return 0, fmt.Errorf("%s cannot be negative (got %d)", field, limit)
	case limit > most:
		return 0, fmt.Errorf("%s cannot be more than %d (got %d); page with After instead", field, most, limit)
	case limit == 0:
		return def, nil
	}
	return limit, nil
}

// Encode makes a cursor of v, a struct whose fields always encode (strings, numbers).
func Encode(v any) string {
	data, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(data)
}

// Decode reads a cursor that Encode made into v; false when s is not one. What it holds is the
// caller's to check: a cursor comes back from a client, and may be forged.
func Decode(s string, v any) bool {
	data, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && json.Unmarshal(data, v) == nil
}

// Quote clips a cursor that was refused for an error message, so that a forged one does not
// fill it.
func Quote(s string) string {
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return fmt.Sprintf("%q", s)
}
