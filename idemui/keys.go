package idemui

import (
	"encoding/hex"
	"errors"
	"net/http"
	"strings"

	"github.com/idemkit/idem"
)

type keysData struct {
	Scope, ID   string
	Info        *idem.KeyInfo
	Fingerprint string
	Missing     string // why nothing is shown: not found
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
		h.badRequest(w, r, badf("scope", "missing: a key is looked up by its scope and id"))
		return
	case d.ID == "":
		h.badRequest(w, r, badf("id", "missing: a key is looked up by its scope and id"))
		return
	}
	if err := key.Validate(); err != nil {
		h.badRequest(w, r, badf("scope and id", "%s", strings.TrimPrefix(err.Error(), "idem: invalid key: ")))
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
	h.render(w, r, http.StatusOK, "keys", p)
}
