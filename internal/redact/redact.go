// Package redact keeps idem's promise about keys in telemetry: spans, span events, metric points
// and log records never carry a key's ID. A short hash of the key stands for it where a record
// needs to tell keys apart (a span of one run, a log line about one run), so that records of one
// key can be found together; the ID itself appears only when the application asks for it
// (idem.RecordKeys, Config.RecordKeys in workflow, idemhttp and idemgrpc). Metrics never carry a
// key, hashed or not: one series per key would be unbounded.
//
// A client's key may be a secret it reuses (a bearer-like token, a payment reference), and
// records travel further than the database: to a tracing vendor, a log pipeline, a support
// ticket. Scopes are not keys and are recorded as they are.
//
// Error texts are the way keys slip in: idem's own errors name the key they are about, for the
// caller who asked with it, and a workflow's or a handler's error may quote it too. So every
// error text that goes into a record passes through [Keys.Text], which replaces the key's ID
// wherever it occurs.
package redact

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"reflect"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of a key in spans: its hash by default, its ID with Full.
const (
	HashAttr = attribute.Key("idem.key.hash")
	IDAttr   = attribute.Key("idem.key.id")
)

// Log attribute names of a key: its hash by default, its ID with Full.
const (
	HashLog = "key_hash"
	IDLog   = "id"
)

// Hash is what stands for the key (scope, id) in records: 16 hex digits, the first 8 bytes of a
// SHA-256 over the length-prefixed scope and id. A cryptographic hash, so that records do not
// give the ID away; the scope is in it, so that two tenants' equal IDs do not look like one
// key. An operator who knows a key finds its records by its hash (idem keys get and idem runs
// show print it).
//
//	redact.Hash("customer:42", "order-7f3a") // "…16 hex digits…"
func Hash(scope, id string) string {
	h := sha256.New()
	var n [8]byte
	for _, part := range []string{"idem.key.v1", scope, id} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// Key is a key as records concern it: its scope and ID.
type Key struct{ Scope, ID string }

// Keys is what records may carry of keys. The zero value, the default, carries hashes only.
type Keys struct {
	// Full records key IDs as they are: for a deployment whose keys are not secrets, where
	// reading them in traces and logs is worth more.
	Full bool
}

// Stand returns what records carry for key in a text: "key:" and its hash, or the ID with Full.
func (k Keys) Stand(key Key) string {
	if k.Full {
		return key.ID
	}
	return "key:" + Hash(key.Scope, key.ID)
}

// Attr is the span attribute of key.
func (k Keys) Attr(key Key) attribute.KeyValue {
	if k.Full {
		return IDAttr.String(key.ID)
	}
	return HashAttr.String(Hash(key.Scope, key.ID))
}

// Log is the log attribute of key.
func (k Keys) Log(key Key) slog.Attr {
	if k.Full {
		return slog.String(IDLog, key.ID)
	}
	return slog.String(HashLog, Hash(key.Scope, key.ID))
}

// Text returns msg with every occurrence of the ID of each of keys replaced by what records carry
// for it (see Stand). Every occurrence, quoted or not, whatever surrounds it: a short ID
// may garble a word of the text, which costs a reader less than a leaked key. Where IDs overlap,
// the longest one at a position wins, and what replaced it is not searched again.
func (k Keys) Text(msg string, keys ...Key) string {
	if k.Full {
		return msg
	}
	found := false
	for _, key := range keys {
		if key.ID != "" && strings.Contains(msg, key.ID) {
			found = true
			break
		}
	}
	if !found {
		return msg // the common case: no copy
	}
	var b strings.Builder
	for i := 0; i < len(msg); {
		best := Key{}
		for _, key := range keys {
			if len(key.ID) > len(best.ID) && strings.HasPrefix(msg[i:], key.ID) {
				best = key
			}
		}
		if best.ID == "" {
			b.WriteByte(msg[i])
			i++
			continue
		}
		b.WriteString(k.Stand(best))
		i += len(best.ID)
	}
	return b.String()
}

// Error is err's text as records may carry it, for a log record's "error" attribute.
func (k Keys) Error(err error, keys ...Key) slog.Attr {
	if err == nil {
		return slog.Any("error", nil)
	}
	return slog.String("error", k.Text(err.Error(), keys...))
}

// RecordError records err on span as span.RecordError does (an "exception" event with the
// error's type and message), with the message passed through Text, and sets the span's status to
// Error with it.
func (k Keys) RecordError(span trace.Span, err error, keys ...Key) {
	msg := k.Text(err.Error(), keys...)
	span.AddEvent("exception", trace.WithAttributes(attribute.String("exception.type", typeName(err)),
		attribute.String("exception.message", msg)))
	span.SetStatus(codes.Error, msg)
}

// typeName names err's type as span.RecordError does: package path and type.
func typeName(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String() // a pointer, or another unnamed type
	}
	return t.PkgPath() + "." + t.Name()
}
