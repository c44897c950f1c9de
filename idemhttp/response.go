package idemhttp

import (
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

// storedResponse is what the middleware stores under a key and replays. Body round-trips
// through idem's JSON as base64, so binary bodies are safe.
type storedResponse struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

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

// storable returns the part of a handler's response that is stored: its status, body and
// end-to-end headers, minus the ones configured away.
func (m *middleware) storable(rec *recorder) storedResponse {
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
		case name == "Set-Cookie" && !m.cfg.ReplaySetCookie:
		default:
			h[name] = append(h[name], values...)
		}
	}
	if len(h) == 0 {
		h = nil
	}
	return storedResponse{Status: rec.status, Header: h, Body: rec.body.Bytes()}
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
