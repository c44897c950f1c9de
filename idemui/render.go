package idemui

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
)

// page is what every page's template gets: the layout's needs, and the page's own data.
type page struct {
	Title   string
	Nav     string // the tab to mark: runs, keys, schedules
	Prefix  string
	Actions bool // Options.AllowActions
	Refresh int  // seconds between reloads while something moves; 0 for none
	Done    string
	Data    any
}

// pageNames are the templates, each joined with layout.html.
var pageNames = []string{"runs", "run", "keys", "schedules", "outbox", "message", "confirm", "error"}

func (h *Handler) parsePages() error {
	h.pages = map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(h.funcs()).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("idemui: error parsing the %s page: %w", name, err)
		}
		h.pages[name] = t
	}
	return nil
}

// render writes a page, whole or not at all: a template that fails half way writes an error
// page instead of half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	p.Prefix, p.Actions, p.Title = h.opts.Prefix, h.opts.AllowActions, clip(visible(p.Title), 120)
	if d := r.URL.Query().Get("done"); doneMessages[d] != "" {
		p.Done = doneMessages[d]
	}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		h.log.ErrorContext(r.Context(), "idemui: error rendering a page", "page", name, "error", err)
		http.Error(w, "error rendering the page; see the server's log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail answers with an error page that says what was wrong.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	h.render(w, r, status, "error", &page{Title: http.StatusText(status), Data: struct {
		Status int
		Text   string
		Msg    string
	}{status, http.StatusText(status), msg}})
}

// badField is a request's field that cannot be used: 400, naming it.
type badField struct {
	field, msg string
}

func (e *badField) Error() string { return e.field + ": " + e.msg }

func badf(field, format string, args ...any) error {
	return &badField{field: field, msg: fmt.Sprintf(format, args...)}
}

// badKey is badf for a key that idem refused: the field, and what idem says is wrong with it
// (its InvalidKeyError's Reason).
func badKey(field string, err error) error {
	var invalid *idem.InvalidKeyError
	if errors.As(err, &invalid) {
		return badf(field, "%s", invalid.Reason)
	}
	return badf(field, "%s", err)
}

func (h *Handler) funcs() template.FuncMap {
	return template.FuncMap{
		"link":     h.link,
		"linkq":    func(path string, pairs []any) string { return h.link(path, pairs...) },
		"time":     stamp,
		"timep":    stampPtr,
		"ago":      ago,
		"dur":      duration,
		"json":     func(b []byte) string { s, _ := h.prettyJSON(b); return s },
		"clipped":  func(b []byte) bool { _, clipped := h.prettyJSON(b); return clipped },
		"size":     byteSize,
		"text":     func(v any) string { return visible(fmt.Sprint(v)) },
		"short":    func(v any, n int) string { return clip(visible(fmt.Sprint(v)), n) },
		"traceURL": h.traceURL,
		"cls":      class,
		"hash":     redact.Hash,
	}
}

// link is a path under the prefix with query parameters given as name, value pairs; pairs
// with an empty value are left out.
func (h *Handler) link(path string, pairs ...any) string {
	q := url.Values{}
	for i := 0; i+1 < len(pairs); i += 2 {
		name := fmt.Sprint(pairs[i])
		switch v := pairs[i+1].(type) {
		case []string:
			for _, s := range v {
				q.Add(name, s)
			}
		default:
			if s := fmt.Sprint(v); s != "" {
				q.Add(name, s)
			}
		}
	}
	if len(q) == 0 {
		return h.opts.Prefix + path
	}
	return h.opts.Prefix + path + "?" + q.Encode()
}

func (h *Handler) traceURL(id string) string {
	if h.opts.TraceURL == "" || id == "" {
		return ""
	}
	return strings.ReplaceAll(h.opts.TraceURL, "{trace_id}", id)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func stampPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return stamp(*t)
}

// ago says how long before now t was (or "in ..." for the future), for a glance.
func ago(t *time.Time) string {
	if t == nil {
		return ""
	}
	d := time.Until(*t)
	if d > 0 {
		return "in " + duration(d)
	}
	return duration(-d) + " ago"
}

// duration is d rounded for a person: 1.2s, 340ms, 3m12s, 2h5m.
func duration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return strconv.FormatInt(d.Microseconds(), 10) + "µs"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d"
}

// prettyJSON indents a JSON value and clips it at ClipBytes, saying whether it did; a value
// that is not JSON is shown as text. Either way html/template escapes it where it lands.
func (h *Handler) prettyJSON(b []byte) (string, bool) {
	if len(b) == 0 {
		return "", false
	}
	var buf bytes.Buffer
	s := string(b)
	if json.Valid(b) && json.Indent(&buf, b, "", "  ") == nil {
		s = buf.String()
	}
	s = visible(s)
	if len(s) <= h.opts.ClipBytes {
		return s, false
	}
	cut := h.opts.ClipBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "\n…", true
}

// visible makes control characters (but newlines and tabs) visible as \u escapes: a stored
// string is shown as the text it is, never as what a terminal or a browser would make of it.
func visible(s string) string {
	if !strings.ContainsFunc(s, hidden) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if hidden(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func hidden(r rune) bool {
	return r != '\n' && r != '\t' && (unicode.IsControl(r) || r == utf8.RuneError || unicode.Is(unicode.Cf, r))
}

// class is a stored state or outcome as a CSS class name: a stored string that is not one of
// ours becomes "other", rather than a class the sheet never meant.
func class(v any) string {
	s := fmt.Sprint(v)
	if s == "" || strings.Trim(s, "abcdefghijklmnopqrstuvwxyz_") != "" {
		return "other"
	}
	return s
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func byteSize(n int) string {
	switch {
	case n < 1024:
		return strconv.Itoa(n) + " B"
	case n < 1024*1024:
		return strconv.FormatFloat(float64(n)/1024, 'f', 1, 64) + " KiB"
	}
	return strconv.FormatFloat(float64(n)/1024/1024, 'f', 1, 64) + " MiB"
}
