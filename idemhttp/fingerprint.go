package idemhttp

import (
	"mime"
	"net/http"
	"strings"

	"github.com/idemkit/idem/internal/digest"
)

// FingerprintFunc digests a request into a value for idem.Key.Fingerprint. body is the whole
// request body, already read (the handler gets its own copy). Two requests under one key with
// different fingerprints are refused (422 by default) instead of replayed. Returning nil turns
// the check off for the request.
//
//	// A form body: the order of fields does not matter to this handler.
//	var formFingerprint idemhttp.FingerprintFunc = func(r *http.Request, body []byte) []byte {
//		values, _ := url.ParseQuery(string(body))
//		return idem.Fingerprint(r.Method, r.URL.Path, values.Encode()) // Encode sorts by key
//	}
type FingerprintFunc func(r *http.Request, body []byte) []byte

// DefaultFingerprint is the fingerprint used unless a [Config] or [RouteConfig] sets another.
// It covers the method, the escaped path, the raw query, the media type of Content-Type
// (lowercased, without parameters) and the body. A JSON body (application/json or any
// +json type) is first put in canonical form by [CanonicalJSON], so that a client that
// re-encodes its request on a retry, with other key order or whitespace, still matches.
//
// Headers other than Content-Type are left out on purpose: tracing, date and authorization
// headers may change between retries of one request.
//
//	cfg := &idemhttp.Config{
//		Scope: scope,
//		Fingerprint: func(r *http.Request, body []byte) []byte {
//			// This API ignores the query string.
//			return idem.Fingerprint(r.Method, r.URL.Path, string(body))
//		},
//	}
func DefaultFingerprint(r *http.Request, body []byte) []byte {
	mediaType := mediaTypeOf(r.Header.Get("Content-Type"))
	// idem.Fingerprint(method, path, query, media type, body), with the canonical body written
	// into the digest as it is made rather than held whole.
	d := digest.New()
	for _, part := range []string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, mediaType} {
		d.Part(len(part))
		d.WriteString(part)
	}
	if !isJSON(mediaType) || !canonicalDigest(d, body) {
		d.Part(len(body))
		_, _ = d.Write(body)
	}
	return d.Sum()
}

func mediaTypeOf(contentType string) string {
	if contentType == "" {
		return ""
	}
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		// Still part of the fingerprint, as written, so that garbage matches only itself.
		return strings.ToLower(strings.TrimSpace(contentType))
	}
	return mediaType
}

func isJSON(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}
