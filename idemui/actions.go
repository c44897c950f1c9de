package idemui

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/outbox"
)

// An action is asked for in two steps: a GET of its confirmation page, which says what it will
// do and holds the form, and the form's POST, which does it. The POST must come from a page of
// the same origin (Sec-Fetch-Site, or Origin where a browser sends no Sec-Fetch-Site) and carry
// the CSRF token of the confirmation page: an HMAC, under a key of this Handler's, of a random
// value in a cookie the page set (SameSite=Strict, HttpOnly). A page of another site can neither
// read the cookie nor make the token.

// actionSpec is what an action needs from its form, and what its page says.
type actionSpec struct {
	Title   string // the confirmation page's title and button
	What    string // what it does, in a sentence
	On      string // run, key or schedule
	Reason  bool   // a cancel's reason
	Fork    bool   // a fork's step and new key
	Note    bool   // a pause's note
	Danger  bool   // styled as destructive
	Message string // the page's note after it was done
}

var actionSpecs = map[string]*actionSpec{
	"cancel": {Title: "Cancel run", On: "run", Reason: true, Danger: true, Message: "The run was cancelled.",
		What: "The run stops at its next step boundary and is stored as cancelled; a step already calling out finishes its call. Its unfinished children are cancelled too."},
	"resume": {Title: "Resume run", On: "run", Message: "The run was resumed: a resume job continues it.",
		What: "A failed run goes on from its first failed step, a cancelled or stuck one from where it stopped, with a fresh budget of attempts."},
	"fork": {Title: "Fork run", On: "run", Fork: true, Message: "The fork was started: this is the new run.",
		What: "A new run of the same workflow and input starts under a new key, with the steps before the one you give copied and replayed; that step and those after it run again, with new derived keys."},
	"key-delete": {Title: "Delete key", On: "key", Danger: true, Message: "The key was deleted: the next request with it runs afresh.",
		What: "The stored result of idem.Do under this key is forgotten, so that the next request with the key runs again."},
	"schedule-pause": {Title: "Pause schedule", On: "schedule", Note: true, Message: "The schedule was paused.",
		What: "The schedule starts no ticks until it is resumed; runs it started go on."},
	"schedule-resume": {Title: "Resume schedule", On: "schedule", Message: "The schedule was resumed.",
		What: "The schedule goes on from its next tick after now; ticks missed while it was paused are not started."},
	"schedule-trigger": {Title: "Trigger schedule", On: "schedule", Message: "The schedule was triggered: this is its new run.",
		What: "A run of the schedule starts now, whatever its next tick, pause or overlap policy say."},
	"outbox-retry": {Title: "Retry message", On: "message", Message: "The message was handed back to the relay.",
		What: "The relay publishes the message again, its attempts reset: a stopped key goes on from it, in order; a dead-lettered or skipped message goes out after the messages of its key that were published meanwhile. Fix what made it fail first, or it fails again."},
	"outbox-skip": {Title: "Skip message", On: "message", Danger: true, Message: "The message was set aside: it will not be published.",
		What: "The message is set aside for good and never published; its key goes on with its next message."},
}

// doneMessages are the notes a page shows after an action redirected to it (?done=cancel): fixed
// texts, so that a link cannot make the page say anything else.
var doneMessages = func() map[string]string {
	m := map[string]string{}
	for name, a := range actionSpecs {
		m[name] = a.Message
	}
	return m
}()

const csrfCookie = "idemui_csrf"

type confirmData struct {
	Action    string
	Spec      *actionSpec
	Scope, ID string // a run's or a key's
	Name      string // a schedule's
	Message   string // an outbox message's id
	Token     string
	Error     string
	Back      string
	Form      url.Values // what was posted, when the action failed
}

// confirmPage shows what an action will do, and its form.
func (h *Handler) confirmPage(w http.ResponseWriter, r *http.Request) {
	if !h.opts.AllowActions {
		h.fail(w, r, http.StatusForbidden, "actions are off in this view (Options.AllowActions; idem ui --allow-actions): it is read-only")
		return
	}
	d, err := h.confirmData(r.URL.Query())
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	d.Token = h.csrfToken(w, r)
	h.render(w, r, http.StatusOK, "confirm", &page{Title: d.Spec.Title, Nav: navOf(d.Spec), Data: d})
}

func navOf(s *actionSpec) string {
	switch s.On {
	case "run":
		return "runs"
	case "message":
		return "outbox"
	}
	return s.On + "s"
}

// confirmData reads an action and what it is on from a query or a form.
func (h *Handler) confirmData(q url.Values) (*confirmData, error) {
	d := &confirmData{Action: q.Get("action"), Scope: q.Get("scope"), ID: q.Get("id"), Name: q.Get("name"), Message: q.Get("message")}
	d.Spec = actionSpecs[d.Action]
	if d.Spec == nil {
		return nil, badf("action", "%q is not an action; use one of cancel, resume, fork, key-delete, schedule-pause, schedule-resume, schedule-trigger, outbox-retry, outbox-skip", d.Action)
	}
	switch d.Spec.On {
	case "run", "key":
		if _, err := runKey(q); err != nil {
			return nil, err
		}
		d.Back = h.link("/run", "scope", d.Scope, "id", d.ID)
		if d.Spec.On == "key" {
			d.Back = h.link("/keys", "scope", d.Scope, "id", d.ID)
		}
	case "message":
		id, err := messageID(d.Message)
		if err != nil {
			return nil, err
		}
		d.Message = id.String()
		d.Back = h.link("/outbox/message", "message", d.Message)
	default:
		if d.Name == "" {
			return nil, badf("name", "missing: name the schedule")
		}
		if strings.ContainsFunc(d.Name, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			return nil, badf("name", "%q is not a schedule's name: a name is printable ASCII without spaces", d.Name)
		}
		d.Back = h.link("/schedules")
	}
	return d, nil
}

// csrfToken is the token of the request's CSRF cookie, which it sets when the request has none.
func (h *Handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(csrfCookie)
	if err != nil || len(c.Value) < 32 {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		c = &http.Cookie{Name: csrfCookie, Value: base64.RawURLEncoding.EncodeToString(b), Path: h.opts.Prefix + "/", HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil}
		http.SetCookie(w, c)
	}
	return h.sign(c.Value)
}

func (h *Handler) sign(v string) string {
	m := hmac.New(sha256.New, h.csrfKey)
	m.Write([]byte(v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// refusal says why a POST may not act, "" when it may.
func (h *Handler) refusal(r *http.Request) string {
	if !h.opts.AllowActions {
		return "actions are off in this view (Options.AllowActions; idem ui --allow-actions): it is read-only"
	}
	// The standard library's check: the browser's Sec-Fetch-Site where it sends one, else its
	// Origin against Host (so a proxy that rewrites Host does not refuse a modern browser).
	if err := sameOrigin.Check(r); err != nil {
		return "the form was sent from another site or origin (Sec-Fetch-Site: " + orNone(r.Header.Get("Sec-Fetch-Site")) +
			", Origin: " + orNone(r.Header.Get("Origin")) + "); act from this view's own pages"
	}
	c, err := r.Cookie(csrfCookie)
	token := r.PostFormValue("csrf")
	switch {
	case err != nil:
		return "the CSRF cookie is missing; open the confirmation page again (cookies must be on for this view)"
	case token == "":
		return "the CSRF token is missing; use the confirmation page's form"
	case !hmac.Equal([]byte(token), []byte(h.sign(c.Value))):
		return "the CSRF token does not match; open the confirmation page again (the server may have restarted)"
	}
	return ""
}

// action does what a confirmation page's form asks, and redirects to what it acted on.
func (h *Handler) action(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, "the form cannot be read: "+err.Error())
		return
	}
	user := h.opts.User(r)
	if why := h.refusal(r); why != "" {
		h.log.WarnContext(r.Context(), "idemui: action refused", "action", r.PostForm.Get("action"), "user", orUnknown(user), "why", why,
			"remote", r.RemoteAddr)
		h.fail(w, r, http.StatusForbidden, why)
		return
	}
	d, err := h.confirmData(r.PostForm)
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	attrs := []any{"action", d.Action, "user", orUnknown(user)}
	switch d.Spec.On {
	case "schedule":
		attrs = append(attrs, "schedule", d.Name)
	case "message":
		attrs = append(attrs, "message", d.Message)
	default:
		attrs = append(attrs, "scope", d.Scope, h.keyLog("", idem.Key{Scope: d.Scope, ID: d.ID}))
	}
	to, err := h.do(r.Context(), d, r.PostForm, &attrs)
	if err != nil {
		h.log.WarnContext(r.Context(), "idemui: action failed", append(attrs, h.keys.Error(err, redact.Key{Scope: d.Scope, ID: d.ID},
			redact.Key{Scope: d.Scope, ID: r.PostForm.Get("new_id")}))...)
		d.Error, d.Form, d.Token = err.Error(), r.PostForm, h.csrfToken(w, r)
		h.render(w, r, actionStatus(err), "confirm", &page{Title: d.Spec.Title, Nav: navOf(d.Spec), Data: d})
		return
	}
	h.log.InfoContext(r.Context(), "idemui: action", attrs...)
	http.Redirect(w, r, to, http.StatusSeeOther)
}

var sameOrigin = http.NewCrossOriginProtection()

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func orUnknown(user string) string {
	if user == "" {
		return "unknown"
	}
	return user
}

// actionStatus is the status of an action's failure: the input was wrong, there was nothing to
// act on, or the engine refused it in the state things are in.
func actionStatus(err error) int {
	var bf *badField
	switch {
	case errors.As(err, &bf), errors.Is(err, idem.ErrInvalidKey):
		return http.StatusBadRequest
	case errors.Is(err, idem.ErrNotFound):
		return http.StatusNotFound
	}
	return http.StatusConflict
}

// do performs the action, and returns where to go next.
func (h *Handler) do(ctx context.Context, d *confirmData, form url.Values, attrs *[]any) (string, error) {
	key := idem.Key{Scope: d.Scope, ID: d.ID}
	back := d.Back + sep(d.Back) + "done=" + d.Action
	switch d.Action {
	case "cancel":
		reason := strings.TrimSpace(form.Get("reason"))
		if reason == "" {
			return "", badf("reason", "missing: say why the run is cancelled (it is stored as the run's error)")
		}
		*attrs = append(*attrs, "reason", reason)
		return back, h.engine.RunCancel(ctx, key, reason)
	case "resume":
		return back, h.engine.RunResume(ctx, key)
	case "fork":
		step, err := strconv.Atoi(strings.TrimSpace(form.Get("from_step")))
		if err != nil || step < 1 {
			return "", badf("from_step", "%q is not a step's position; give a number from 1", form.Get("from_step"))
		}
		newKey := idem.Key{Scope: d.Scope, ID: strings.TrimSpace(form.Get("new_id"))}
		if err := idem.ValidateID(newKey.ID); err != nil {
			return "", badKey("new_id", err)
		}
		*attrs = append(*attrs, "from_step", step, h.keyLog("new_", newKey))
		to := h.link("/run", "scope", newKey.Scope, "id", newKey.ID, "done", "fork")
		return to, h.engine.RunFork(ctx, key, newKey, step)
	case "key-delete":
		return back, idem.KeyDelete(ctx, h.db, key, h.keyOpts...)
	case "schedule-pause":
		note := strings.TrimSpace(form.Get("note"))
		*attrs = append(*attrs, "note", note)
		return back, h.engine.SchedulePause(ctx, d.Name, note)
	case "schedule-resume":
		return back, h.engine.ScheduleResume(ctx, d.Name)
	case "outbox-retry", "outbox-skip":
		id, _ := uuid.Parse(d.Message) // checked by confirmData
		if d.Action == "outbox-retry" {
			return back, outbox.Retry(ctx, h.db, id, h.outboxOpts()...)
		}
		return back, outbox.Skip(ctx, h.db, id, h.outboxOpts()...)
	case "schedule-trigger":
		k, err := h.engine.ScheduleTrigger(ctx, d.Name)
		if err != nil {
			return "", err
		}
		*attrs = append(*attrs, h.keyLog("run_", k))
		return h.link("/run", "scope", k.Scope, "id", k.ID, "done", "schedule-trigger"), nil
	}
	return "", badf("action", "%q is not an action", d.Action)
}

// keyLog is what the log of actions carries of a key: its hash (key_hash), or its ID with
// Options.RecordKeys, as every record idem makes; prefix names which key it is.
func (h *Handler) keyLog(prefix string, key idem.Key) slog.Attr {
	a := h.keys.Log(redact.Key{Scope: key.Scope, ID: key.ID})
	a.Key = prefix + a.Key
	return a
}

func sep(u string) string {
	if strings.Contains(u, "?") {
		return "&"
	}
	return "?"
}
