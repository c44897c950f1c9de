package idemui

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem"
)

type keysData struct {
	Scope, ID   string
	Info        *idem.KeyInfo
	Fingerprint string
	Missing     string // why nothing is shown: not found
	Status      string // what the stored result answered, when it is a response idem's middleware stored
	Result      []byte // the stored result, with Options.ShowResults

	// A scope's keys, when no id is given (idem.KeyList).
	Prefix, After string
	List          *idem.KeyListResult
}

// keysPage looks a key up by scope and id: its owner (Do, or a run), fingerprint, times and the
// size of its stored result. The result itself is never shown: it is the client's answer, which
// may hold what only the client should see.
func (h *Handler) keysPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := &keysData{Scope: q.Get("scope"), ID: q.Get("id")}
	p := &page{Title: "Keys", Nav: "keys", Data: d}
	if d.Scope == "" && d.ID == "" {
		h.render(w, r, http.StatusOK, "keys", p)
		return
	}
	key := idem.Key{Scope: d.Scope, ID: d.ID}
	switch {
	case d.Scope == "":
		h.badRequest(w, r, badf("scope", "missing: a key is looked up by its scope and id, and a scope's keys listed by the scope"))
		return
	case d.ID == "":
		h.keyList(w, r, d, p)
		return
	}
	if err := key.Validate(); err != nil {
		h.badRequest(w, r, badKey("scope and id", err))
		return
	}
	info, err := idem.KeyGet(r.Context(), h.db, key, h.keyOpts...)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		d.Missing = err.Error()
		h.render(w, r, http.StatusNotFound, "keys", p)
		return
	case err != nil:
		h.internal(w, r, err)
		return
	}
	d.Info, d.Fingerprint = info, hex.EncodeToString(info.Fingerprint)
	if info.Workflow == "" && info.ResultSize > 0 {
		result, err := idem.KeyResult(r.Context(), h.db, key, h.keyOpts...)
		switch {
		case errors.Is(err, idem.ErrNotFound): // deleted in between: shown as it was
		case err != nil:
			h.internal(w, r, err)
			return
		}
		d.Status = storedStatus(result)
		if h.opts.ShowResults {
			d.Result = result
		}
	}
	h.render(w, r, http.StatusOK, "keys", p)
}

// keyList lists a scope's keys, by id, a page at a time.
func (h *Handler) keyList(w http.ResponseWriter, r *http.Request, d *keysData, p *page) {
	q := r.URL.Query()
	d.Prefix, d.After = q.Get("prefix"), q.Get("after")
	res, err := idem.KeyList(r.Context(), h.db, &idem.KeyListParams{Scope: d.Scope, Prefix: d.Prefix, After: d.After, Limit: h.opts.PageSize},
		h.keyOpts...)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	switch {
	case errors.Is(err, idem.ErrInvalidCursor):
		h.badRequest(w, r, badf("after", "not a cursor of this list; start from the first page"))
	case strings.HasPrefix(msg, "idem: KeyListParams.Scope"):
		h.badRequest(w, r, badf("scope", "%s", strings.TrimPrefix(msg, "idem: KeyListParams.Scope ")))
	case strings.HasPrefix(msg, "idem: KeyListParams.Prefix"):
		h.badRequest(w, r, badf("prefix", "%s", strings.TrimPrefix(msg, "idem: KeyListParams.Prefix ")))
	case err != nil:
		h.internal(w, r, err)
	default:
		d.List = res
		h.render(w, r, http.StatusOK, "keys", p)
	}
}

// storedStatus says what a stored result answered, when it is one of the shapes idem's
// middleware stores: an idemhttp.StoredResponse ({"status": 201, "header": ..., "body": ...}),
// or idemgrpc's reply (a message type, or an error status). Anything else is a value of the
// application's own, whose fields mean nothing here: "".
func storedStatus(result []byte) string {
	var fields map[string]json.RawMessage
	if json.Unmarshal(result, &fields) != nil {
		return ""
	}
	known := func(names ...string) bool {
		for k := range fields {
			if !slices.Contains(names, k) {
				return false
			}
		}
		return true
	}
	var status int
	if known("status", "header", "body") && json.Unmarshal(fields["status"], &status) == nil && status >= 100 && status <= 599 {
		return "HTTP " + strconv.Itoa(status) + " " + http.StatusText(status)
	}
	var typ, rpcStatus string // a message's type; an error's google.rpc.Status, as base64
	if known("type", "message", "status", "header", "trailer") {
		switch {
		case json.Unmarshal(fields["type"], &typ) == nil && typ != "":
			return "gRPC response " + typ
		case json.Unmarshal(fields["status"], &rpcStatus) == nil && rpcStatus != "":
			return "gRPC error"
		}
	}
	return ""
}
