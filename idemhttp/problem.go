package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// DefaultProblemTypeBase starts the "type" URI of every problem the middleware answers with; the
// rest is the problem's name, listed in the package documentation. The URI leads to the row of
// the README's status table that explains the problem (for example
// ".../README.md#idempotency-key-missing").
const DefaultProblemTypeBase = "https://github.com/idemkit/idem/blob/main/README.md#"

// Problem is an RFC 9457 problem details object, the body of every response the middleware
// produces itself (as opposed to a response of the handler, or a replay of one). Clients can
// decode it to tell the cases apart by Type.
//
//	var p idemhttp.Problem
//	if resp.Header.Get("Content-Type") == "application/problem+json" {
//		_ = json.NewDecoder(resp.Body).Decode(&p)
//		log.Printf("%s: %s", p.Title, p.Detail)
//	}
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// problemKind is one row of the middleware's own status table.
type problemKind struct {
	name   string
	status int
	title  string
}

var (
	problemKeyMissing     = problemKind{"idempotency-key-missing", http.StatusBadRequest, "Idempotency key missing"}
	problemKeyInvalid     = problemKind{"idempotency-key-invalid", http.StatusBadRequest, "Idempotency key invalid"}
	problemNoScope        = problemKind{"idempotency-scope-missing", http.StatusBadRequest, "No identity for the idempotency key"}
	problemScopeAmbiguous = problemKind{"idempotency-scope-ambiguous", http.StatusBadRequest, "More than one identity for the idempotency key"}
	problemBodyTooLarge   = problemKind{"request-body-too-large", http.StatusRequestEntityTooLarge, "Request body too large"}
	problemBodyUnreadable = problemKind{"request-body-unreadable", http.StatusBadRequest, "Request body could not be read"}
	problemInFlight       = problemKind{"idempotency-key-in-flight", http.StatusConflict, "Request with this idempotency key is in progress"}
	problemMismatch       = problemKind{"idempotency-key-reused", http.StatusUnprocessableEntity, "Idempotency key reused for a different request"}
	problemStreaming      = problemKind{"streaming-response-refused", http.StatusInternalServerError, "Streaming response refused"}
	problemTooLarge       = problemKind{"response-too-large", http.StatusInternalServerError, "Response too large to store"}
	problemHandlerTx      = problemKind{"handler-transaction-failed", http.StatusInternalServerError, "Handler left its transaction failed"}
	problemMisconfigured  = problemKind{"idempotency-misconfigured", http.StatusInternalServerError, "Idempotency misconfigured"}
	problemUnavailable    = problemKind{"idempotency-store-unavailable", http.StatusServiceUnavailable, "Idempotency store unavailable"}
)

// problemKinds are all of them, for the test that holds the README to them.
var problemKinds = []problemKind{problemKeyMissing, problemKeyInvalid, problemNoScope, problemScopeAmbiguous, problemBodyTooLarge,
	problemBodyUnreadable, problemInFlight, problemMismatch, problemStreaming, problemTooLarge, problemHandlerTx,
	problemMisconfigured, problemUnavailable}

// maxDetail bounds a problem's detail; maxEcho the part of it quoted from the request. A detail
// that repeated a client's header or path in full would let a client make the server write,
// and log, a megabyte per request.
const (
	maxDetail = 1024
	maxEcho   = 64
)

// excerpt returns s, or its first maxEcho bytes (on a rune boundary) followed by "…".
func excerpt(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	cut := maxEcho
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// writeProblem answers with an RFC 9457 problem. status overrides the kind's when non-zero (the
// mismatch status is configurable); retryAfter > 0 adds a Retry-After header in whole seconds.
func (m *middleware) writeProblem(w http.ResponseWriter, kind problemKind, status int, retryAfter time.Duration, detail string) {
	if status == 0 {
		status = kind.status
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	// A problem is about this attempt; a cache must not hand it to the retry.
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(retryAfter), 10))
	}
	if len(detail) > maxDetail {
		cut := maxDetail
		for cut > 0 && !utf8.RuneStart(detail[cut]) {
			cut--
		}
		detail = detail[:cut] + "…"
	}
	body, _ := json.Marshal(Problem{Type: m.cfg.ProblemTypeBase + kind.name, Title: kind.title, Status: status, Detail: detail})
	body = append(body, '\n')
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// retryAfterSeconds rounds up, and to at least one second: Retry-After has no finer unit, and
// "0" would invite a busy loop.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}
