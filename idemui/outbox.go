package idemui

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
)

// The outbox's page: its lanes (which relay holds each, and how far behind it is) and its
// messages, those that need an operator (stopped keys, dead letters, skipped) unless another
// status is asked for; and a message's page, where it is retried or skipped.

// outboxStatuses are the statuses the list filters by, "" being those that need an operator.
var outboxStatuses = []string{"", "stopped", "dead", "skipped", "pending", "published", "all"}

type lane struct {
	outbox.LaneInfo
	Lag time.Duration // how long its oldest unpublished message has waited; 0 for none
}

type outboxData struct {
	Status, Topic, Key string
	Statuses           []string
	Lanes              []lane
	Messages           []*outbox.Info
	Next               string // the After of the next page, "" on the last
	After              string
}

func (h *Handler) outboxOpts() []outbox.Option { return []outbox.Option{outbox.Schema(h.opts.Schema)} }

func (h *Handler) outboxPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := &outboxData{Status: q.Get("status"), Topic: q.Get("topic"), Key: q.Get("key"), After: q.Get("after"), Statuses: outboxStatuses}
	params := &outbox.ListParams{Status: outbox.Status(d.Status), Topic: d.Topic, Key: d.Key, Limit: h.opts.PageSize}
	if d.After != "" {
		after, err := strconv.ParseInt(d.After, 10, 64)
		if err != nil || after < 0 {
			h.badRequest(w, r, badf("after", "%q is not a position in the outbox; start from the first page", d.After))
			return
		}
		params.After = after
	}
	for field, v := range map[string]string{"topic": d.Topic, "key": d.Key} {
		if strings.ContainsFunc(v, hidden) {
			h.badRequest(w, r, badf(field, "%q has a control character", v))
			return
		}
	}
	msgs, err := outbox.List(r.Context(), h.db, params, h.outboxOpts()...)
	if err != nil && strings.HasPrefix(err.Error(), "outbox: ListParams.Status") {
		err = badf("status", "%q is not a status; use stopped, dead, skipped, pending, published or all", d.Status)
	}
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	lanes, err := outbox.Lanes(r.Context(), h.db, h.outboxOpts()...)
	if err != nil {
		h.internal(w, r, err)
		return
	}
	for _, l := range lanes {
		v := lane{LaneInfo: l}
		if l.Oldest != nil {
			v.Lag = max(time.Since(*l.Oldest), 0)
		}
		d.Lanes = append(d.Lanes, v)
	}
	d.Messages = msgs
	if len(msgs) == params.Limit && params.Limit > 0 {
		d.Next = strconv.FormatInt(msgs[len(msgs)-1].Position, 10)
	}
	h.render(w, r, http.StatusOK, "outbox", &page{Title: "Outbox", Nav: "outbox", Data: d})
}

// messageID reads the message parameter: a message's id.
func messageID(v string) (uuid.UUID, error) {
	if v == "" {
		return uuid.Nil, badf("message", "missing: name the message by its id")
	}
	id, err := uuid.Parse(v)
	if err != nil {
		return uuid.Nil, badf("message", "%q is not a message's id (a UUID)", v)
	}
	return id, nil
}

func (h *Handler) messagePage(w http.ResponseWriter, r *http.Request) {
	id, err := messageID(r.URL.Query().Get("message"))
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	info, err := outbox.Get(r.Context(), h.db, id, h.outboxOpts()...)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, err.Error())
		return
	case err != nil:
		h.internal(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "message", &page{Title: "Message " + id.String(), Nav: "outbox", Data: info})
}
