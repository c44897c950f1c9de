package idemhttp

import (
	"bytes"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

// StoredResponse is what the middleware stores under a key and replays to every retry: the
// handler's status, its end-to-end headers (less the ones always left out, Set-Cookie unless
// Config.ReplaySetCookie, and Config.DropHeaders) and its whole body. It is stored, in
// idem's table, for Config.TTL. A [Redactor] sees it before it is stored.
//
//	redact := func(r *http.Request, resp *idemhttp.StoredResponse) {
//		resp.Header.Del("X-Debug-Token")
//	}
type StoredResponse struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	// Body round-trips through idem's JSON as base64, so binary bodies are safe.
	Body []byte `json:"body,omitempty"`
}

// Redactor changes what is stored of a handler's response before it is stored: the client of
// this request gets the response as the handler wrote it, and every replay gets what the
// Redactor left. The middleware calls it in the request's transaction, once per attempt, with a
// copy that the Redactor may change freely, except for the status: a replay always has the
// first answer's status.
//
// A response is stored whole, headers and body, for Config.TTL, and replayed to anyone who
// sends its key within its scope. A secret shown once, such as an API key or a one-time
// password returned at creation, would be stored in the database and shown again by every
// replay. Redact it, and make the redacted body say so, since a client whose first answer was
// lost (a timeout, a dropped connection, a lost COMMIT acknowledgement) gets the replay:
//
//	idemhttp.Route(&idemhttp.RouteConfig{
//		Redact: func(r *http.Request, resp *idemhttp.StoredResponse) {
//			var key apiKey
//			if json.Unmarshal(resp.Body, &key) == nil && key.Secret != "" {
//				key.Secret, key.SecretShown = "", true // "shown once; rotate it if it was lost"
//				resp.Body, _ = json.Marshal(key)
//			}
//		},
//	}, createAPIKey)
//
// A Redactor cannot refuse to store a response: the response is what the key's row records,
// and committing the handler's effects without it would let a retry run them again. A handler
// that must not commit answers 5xx, or Store returns false for its status; then nothing is
// stored and nothing of the transaction commits, and the retry runs afresh.
type Redactor func(r *http.Request, resp *StoredResponse)

// alwaysDropped are never stored: hop-by-hop headers (RFC 9110, section 7.6.1) belong to one
// connection, Date to one moment, and Content-Length is recomputed when the body is written.
var alwaysDropped = map[string]bool{
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Connection":    true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
	"Date":                true,
	"Content-Length":      true,
}

// CredentialHeaders returns the response headers that carry credentials, which the middleware
// does not store (and so never replays) unless Config.StoreCredentialHeaders names them:
// Authorization, Proxy-Authorization, Cookie, Set-Cookie, Set-Cookie2, Authentication-Info and
// Proxy-Authentication-Info. A stored response is kept for the TTL and replayed to whoever sends
// its key in its scope, which is no place for a session or a token. Headers of your own that
// carry secrets go in Config.DropHeaders, or a Redactor. It returns a new slice on every call.
//
//	for _, h := range idemhttp.CredentialHeaders() { fmt.Println(h) }
func CredentialHeaders() []string {
	return []string{"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "Set-Cookie2",
		"Authentication-Info", "Proxy-Authentication-Info"}
}

var credentialHeaders = func() map[string]bool {
	m := map[string]bool{}
	for _, h := range CredentialHeaders() {
		m[h] = true
	}
	return m
}()

// headerSize is what a header takes in the stored response, as on the wire: each value with its
// name, ": " and CRLF.
func headerSize(h http.Header) int {
	n := 0
	for name, values := range h {
		for _, v := range values {
			n += len(name) + len(v) + 4
		}
	}
	return n
}

// storable returns the part of a handler's response that is stored: its status, body and
// end-to-end headers, minus the ones configured away.
func (m *middleware) storable(rec *recorder) StoredResponse {
	h := make(http.Header, len(rec.sent))
	// Headers named in Connection are hop-by-hop too.
	perConn := map[string]bool{}
	for _, v := range rec.sent.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			perConn[textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))] = true
		}
	}
	replayed := textproto.CanonicalMIMEHeaderKey(m.cfg.ReplayedHeader)
	for name, values := range rec.sent {
		name = textproto.CanonicalMIMEHeaderKey(name)
		switch {
		case alwaysDropped[name], perConn[name], m.cfg.dropExtra[name], name == replayed:
		case credentialHeaders[name] && !m.cfg.keepCredential[name]:
		default:
			h[name] = append(h[name], values...)
		}
	}
	if len(h) == 0 {
		h = nil
	}
	return StoredResponse{Status: rec.status, Header: h, Body: rec.body.Bytes()}
}

// redacted applies the route's Redactor to a copy of resp, keeping the status.
func redacted(rt route, r *http.Request, resp StoredResponse) StoredResponse {
	if rt.redact == nil {
		return resp
	}
	out := StoredResponse{Status: resp.Status, Header: resp.Header.Clone(), Body: bytes.Clone(resp.Body)}
	if out.Header == nil {
		out.Header = make(http.Header)
	}
	rt.redact(r, &out)
	out.Status = resp.Status
	if len(out.Header) == 0 {
		out.Header = nil
	}
	return out
}

// writeResponse sends a response from a buffer: the handler's own (header is all it set) or a
// replay (header is the stored subset, plus the replayed marker).
func writeResponse(w http.ResponseWriter, status int, header http.Header, body []byte) {
	dst := w.Header()
	for name, values := range header {
		dst[name] = append([]string(nil), values...)
	}
	dst.Del("Content-Length")
	if bodyAllowed(status) {
		dst.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if bodyAllowed(status) && len(body) > 0 {
		_, _ = w.Write(body)
	}
}

// bodyAllowed mirrors net/http, which refuses a body for these statuses.
func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified && (status < 100 || status >= 200)
}
