package idemui

import (
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/workflow"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Options configure a [Handler]. nil, and every zero field, mean the defaults: read-only, at
// the root of the mux, logging to slog.Default().
//
//	h, err := idemui.NewHandler(engine, &idemui.Options{
//		Prefix:       "/ops/idem",
//		AllowActions: true,
//		User:         func(r *http.Request) string { return currentUser(r.Context()).Email },
//		TraceURL:     "https://jaeger.internal/trace/{trace_id}",
//	})
type Options struct {
	// Prefix is the path the handler is mounted under ("/ops/idem"), without a trailing slash;
	// "" for the root. The handler's links start with it, and it serves paths under it only, so
	// mount it with the prefix, or strip nothing: mux.Handle("/ops/idem/", h).
	Prefix string

	// AllowActions turns on the buttons that change things: cancel, resume and fork a run,
	// delete a key, pause, resume and trigger a schedule. Each is a POST with a CSRF token, from
	// a page of the same origin, after a confirmation page, and is logged with the acting user.
	// Off by default: the view is read-only and refuses every POST with 403.
	AllowActions bool

	// User names the person acting, from the request (the application's session, an
	// authenticating proxy's header), for the log of actions. Default: the user name of the
	// request's basic authentication, or "" (logged as unknown).
	User func(r *http.Request) string

	// TraceURL links a run's trace id to the tracing UI: "{trace_id}" in it is replaced by the
	// 32 hex digits of the trace that started the run. "" shows the id without a link.
	TraceURL string

	// ShowResults shows a key's stored result (what idem.Do stored, and replays to the client)
	// on its page. Off by default: the result is the client's answer and may hold what only the
	// client should see; the page shows its size and, for a response of idemhttp's middleware,
	// its HTTP status.
	ShowResults bool

	// ClipBytes is how much of a JSON value (an input, an output, a step's result) a page shows,
	// pretty-printed; the whole value is a download away. Default 4096.
	ClipBytes int

	// PageSize is the runs list's default page size (a request's limit overrides it, up to
	// workflow.MaxRunListLimit). Default 50.
	PageSize int

	// Schema is the Postgres schema of idem's tables, as in the engine's Config.Schema, for
	// key lookups (idem.KeyGet, idem.KeyDelete). Default "": search_path decides.
	Schema string

	// RecordKeys makes the log of actions carry the IDs of the keys acted on (id, new_id,
	// run_id), as idem.RecordKeys does for idem's other records. By default it carries their
	// hashes (key_hash, new_key_hash, run_key_hash), which the run's and the key's pages show: a
	// client's key may be a secret it reuses, and logs travel further than the database.
	RecordKeys bool

	// Logger receives the log of actions (Info, with the user) and errors reading the database
	// (Error). Default slog.Default().
	Logger *slog.Logger
}

// Handler serves the web view of an engine's runs, keys and schedules. It is an http.Handler;
// make one with [NewHandler].
//
//	h, err := idemui.NewHandler(engine, nil)
//	http.ListenAndServe("127.0.0.1:8081", h)
type Handler struct {
	engine  *workflow.Engine
	db      workflow.DB
	opts    Options
	keyOpts []idem.Option
	log     *slog.Logger
	csrfKey []byte // signs the CSRF tokens; new with every Handler
	keys    redact.Keys
	mux     *http.ServeMux
	pages   map[string]*template.Template
}

// Defaults of Options.
//
//	h, err := idemui.NewHandler(engine, &idemui.Options{ClipBytes: 4 * idemui.DefaultClipBytes})
const (
	DefaultClipBytes = 4096
	DefaultPageSize  = 50
)

// NewHandler returns the view of engine's runs, keys and schedules. opts may be nil for the
// defaults (read-only, at the root). It checks opts and names the field it refuses.
//
// Mount it behind the application's own authentication, as any admin page: it shows inputs,
// outputs and errors of runs, which may hold what only operators should see.
//
//	h, err := idemui.NewHandler(engine, &idemui.Options{Prefix: "/ops/idem"})
//	if err != nil {
//		return err
//	}
//	mux.Handle("/ops/idem/", requireAdmin(h))
func NewHandler(engine *workflow.Engine, opts *Options) (*Handler, error) {
	if engine == nil {
		return nil, errors.New("idemui: engine cannot be nil")
	}
	o := Options{}
	if opts != nil {
		o = *opts
	}
	switch {
	case o.Prefix != "" && (!strings.HasPrefix(o.Prefix, "/") || strings.HasSuffix(o.Prefix, "/")):
		return nil, fmt.Errorf("idemui: Prefix must start with a slash and not end with one, as in \"/ops/idem\" (got %q)", o.Prefix)
	case strings.ContainsAny(o.Prefix, "?#{} \"'<>"):
		return nil, fmt.Errorf("idemui: Prefix must be a plain path (got %q)", o.Prefix)
	case o.TraceURL != "" && !strings.Contains(o.TraceURL, "{trace_id}"):
		return nil, fmt.Errorf("idemui: TraceURL must hold {trace_id}, where the trace's id goes (got %q)", o.TraceURL)
	case o.ClipBytes < 0:
		return nil, fmt.Errorf("idemui: ClipBytes cannot be negative (got %d)", o.ClipBytes)
	case o.PageSize < 0 || o.PageSize > workflow.MaxRunListLimit:
		return nil, fmt.Errorf("idemui: PageSize must be between 1 and %d, or 0 for the default (got %d)", workflow.MaxRunListLimit, o.PageSize)
	}
	if o.ClipBytes == 0 {
		o.ClipBytes = DefaultClipBytes
	}
	if o.PageSize == 0 {
		o.PageSize = DefaultPageSize
	}
	if o.User == nil {
		o.User = basicAuthUser
	}
	h := &Handler{engine: engine, db: engine.DB(), opts: o, keyOpts: []idem.Option{idem.Schema(o.Schema)}, log: o.Logger,
		csrfKey: make([]byte, 32), mux: http.NewServeMux(), keys: redact.Keys{Full: o.RecordKeys}}
	if h.log == nil {
		h.log = slog.Default()
	}
	if _, err := rand.Read(h.csrfKey); err != nil {
		return nil, fmt.Errorf("idemui: error making a CSRF key: %w", err)
	}
	if err := h.parsePages(); err != nil {
		return nil, err
	}
	static, _ := fs.Sub(assets, "static")
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", cacheFor(http.FileServerFS(static))))
	h.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, h.opts.Prefix+"/runs", http.StatusFound)
	})
	h.mux.HandleFunc("GET /runs", h.runsPage)
	h.mux.HandleFunc("GET /run", h.runPage)
	h.mux.HandleFunc("GET /run/json", h.runJSON)
	h.mux.HandleFunc("GET /keys", h.keysPage)
	h.mux.HandleFunc("GET /schedules", h.schedulesPage)
	h.mux.HandleFunc("GET /outbox", h.outboxPage)
	h.mux.HandleFunc("GET /outbox/message", h.messagePage)
	h.mux.HandleFunc("GET /confirm", h.confirmPage)
	h.mux.HandleFunc("POST /action", h.action)
	h.mux.HandleFunc("/action", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		h.fail(w, r, http.StatusMethodNotAllowed, "actions are POST only: use the confirmation page's button")
	})
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusNotFound, "no such page: "+r.URL.Path)
	})
	return h, nil
}

func basicAuthUser(r *http.Request) string {
	user, _, _ := r.BasicAuth()
	return user
}

// ServeHTTP serves a request for a path under Options.Prefix; any other is 404.
//
//	mux.Handle("/ops/idem/", h)
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin")
	// Scripts and styles of our own only: a stored string that escaped escaping still could
	// not run.
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	path := r.URL.Path
	if h.opts.Prefix != "" {
		rest, ok := strings.CutPrefix(path, h.opts.Prefix)
		if !ok || (rest != "" && rest[0] != '/') {
			h.fail(w, r, http.StatusNotFound, "no such page: "+path)
			return
		}
		if rest == "" {
			http.Redirect(w, r, h.opts.Prefix+"/runs", http.StatusFound)
			return
		}
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path, u.RawPath = rest, ""
		r2.URL = &u
		r = r2
	}
	h.mux.ServeHTTP(w, r)
}

func cacheFor(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		next.ServeHTTP(w, r)
	})
}
