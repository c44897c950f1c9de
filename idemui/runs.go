package idemui

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/workflow"
)

// knownStates are the states a filter may name, in the order of a run's life.
var knownStates = []workflow.RunState{workflow.RunStateRunning, workflow.RunStateQueued, workflow.RunStateSleeping,
	workflow.RunStateAwaiting, workflow.RunStateDone, workflow.RunStateFailed, workflow.RunStateCancelled, workflow.RunStateTimedOut}

// runFilter is the runs list's query, as the form and the links carry it.
type runFilter struct {
	States    []string
	Workflow  string // comma-separated
	Version   string // comma-separated
	Scope     string
	Attrs     []string // k=v
	Since     string
	Until     string
	Limit     int
	After     string
	ShowLimit string // the limit as given, "" for the default

	One       string // the state when one is selected, for the form's select
	FirstAttr string // the first attribute, for the form's field
}

// parseRunFilter reads the runs list's query. A value it cannot use is a *badField naming it.
func (h *Handler) parseRunFilter(q url.Values) (*runFilter, *workflow.RunListParams, error) {
	f := &runFilter{Workflow: q.Get("workflow"), Version: q.Get("version"), Scope: q.Get("scope"), Since: q.Get("since"), Until: q.Get("until"),
		After: q.Get("after"), Limit: h.opts.PageSize, ShowLimit: q.Get("limit")}
	p := &workflow.RunListParams{Scope: f.Scope, After: f.After}
	for _, v := range q["state"] {
		for s := range strings.SplitSeq(v, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			if !slices.Contains(knownStates, workflow.RunState(s)) {
				return f, nil, badf("state", "%q is not a run state; use one of %s", s, joinStates())
			}
			if !slices.Contains(f.States, s) {
				f.States = append(f.States, s)
				p.States = append(p.States, workflow.RunState(s))
			}
		}
	}
	if strings.ContainsFunc(f.Workflow, hidden) {
		return f, nil, badf("workflow", "%q has a control character; a workflow's name has none", f.Workflow)
	}
	for w := range strings.SplitSeq(f.Workflow, ",") {
		if w = strings.TrimSpace(w); w != "" {
			p.Workflows = append(p.Workflows, w)
		}
	}
	if strings.ContainsFunc(f.Version, hidden) {
		return f, nil, badf("version", "%q has a control character; a code version has none", f.Version)
	}
	for v := range strings.SplitSeq(f.Version, ",") {
		if v = strings.TrimSpace(v); v != "" {
			p.Versions = append(p.Versions, v)
		}
	}
	for _, a := range q["attr"] {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return f, nil, badf("attr", "%q is not key=value", a)
		}
		if p.Attributes == nil {
			p.Attributes = map[string]string{}
		}
		p.Attributes[k] = v
		f.Attrs = append(f.Attrs, a)
	}
	var err error
	if p.Since, err = parseTime("since", f.Since); err != nil {
		return f, nil, err
	}
	if p.Until, err = parseTime("until", f.Until); err != nil {
		return f, nil, err
	}
	if f.ShowLimit != "" {
		n, err := strconv.Atoi(f.ShowLimit)
		if err != nil || n < 1 || n > workflow.MaxRunListLimit {
			return f, nil, badf("limit", "%q is not a page size; give a number from 1 to %d", f.ShowLimit, workflow.MaxRunListLimit)
		}
		f.Limit = n
	}
	p.Limit = f.Limit
	if len(f.States) == 1 {
		f.One = f.States[0]
	}
	if len(f.Attrs) > 0 {
		f.FirstAttr = f.Attrs[0]
	}
	if f.Scope != "" {
		if err := (idem.Key{Scope: f.Scope, ID: "x"}).Validate(); err != nil {
			return f, nil, badKey("scope", err)
		}
	}
	return f, p, nil
}

func joinStates() string {
	s := make([]string, len(knownStates))
	for i, st := range knownStates {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

// timeLayouts are what a time filter takes besides a duration before now: RFC 3339, and what
// a browser's datetime-local and date inputs send (read as UTC).
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04", "2006-01-02"}

func parseTime(field, v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	for _, layout := range timeLayouts {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, badf(field, "%q is not a time; give RFC 3339 (2026-11-23T02:20:35Z), a date (2026-11-23) or a duration before now (24h)", v)
}

// query is the filter as a link's pairs, with after set to next (or left out).
func (f *runFilter) query(after string) []any {
	return []any{"state", f.States, "workflow", f.Workflow, "version", f.Version, "scope", f.Scope, "attr", f.Attrs, "since", f.Since, "until", f.Until,
		"limit", f.ShowLimit, "after", after}
}

type runsData struct {
	Filter  *runFilter
	Counts  []workflow.RunCount
	Total   int64
	Approx  bool // Total holds an estimate
	States  []workflow.RunState
	Runs    []*workflow.RunRow
	Next    []any // the next page's query, nil on the last
	First   []any // the first page's query, nil on the first
	Filters bool  // any filter but the page is set
}

func (h *Handler) runsPage(w http.ResponseWriter, r *http.Request) {
	f, params, err := h.parseRunFilter(r.URL.Query())
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	res, err := h.engine.RunList(r.Context(), params)
	if errors.Is(err, workflow.ErrInvalidCursor) {
		h.fail(w, r, http.StatusBadRequest, "after: not a cursor of this list; start from the first page")
		return
	}
	if err != nil && strings.HasPrefix(err.Error(), "workflow: RunListParams.Attributes") {
		err = badf("attr", "%s", strings.TrimPrefix(err.Error(), "workflow: RunListParams.Attributes "))
	}
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	counts, err := h.engine.RunCounts(r.Context(), 0)
	if err != nil {
		h.internal(w, r, err)
		return
	}
	d := &runsData{Filter: f, Counts: counts, States: knownStates, Runs: res.Runs,
		Filters: len(f.States) > 0 || f.Workflow != "" || f.Version != "" || f.Scope != "" || len(f.Attrs) > 0 || f.Since != "" || f.Until != ""}
	for _, c := range counts {
		d.Total += c.N
		d.Approx = d.Approx || c.Estimated
	}
	if res.Next != "" {
		d.Next = f.query(res.Next)
	}
	if f.After != "" {
		d.First = f.query("")
	}
	h.render(w, r, http.StatusOK, "runs", &page{Title: "Runs", Nav: "runs", Data: d})
}

// badRequest answers an error of the request's making with 400 (the engine's checks of a
// filter, a key or a name), and anything else as internal.
func (h *Handler) badRequest(w http.ResponseWriter, r *http.Request, err error) {
	var bf *badField
	switch {
	case errors.As(err, &bf):
		h.fail(w, r, http.StatusBadRequest, bf.Error())
	case errors.Is(err, idem.ErrInvalidKey), isCheckError(err):
		h.fail(w, r, http.StatusBadRequest, err.Error())
	default:
		h.internal(w, r, err)
	}
}

// isCheckError tells the engine's refusals of its parameters (sentences naming the field, made
// before any SQL) from failures of the database.
func isCheckError(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "workflow: RunListParams.") || strings.HasPrefix(s, "workflow: a schedule's name") ||
		strings.HasPrefix(s, "workflow: schedule name")
}

func (h *Handler) internal(w http.ResponseWriter, r *http.Request, err error) {
	h.log.ErrorContext(r.Context(), "idemui: error reading the database", "path", r.URL.Path, "error", err)
	h.fail(w, r, http.StatusInternalServerError, "error reading the database: "+err.Error())
}

// runKey reads the scope and id parameters of a run's page.
func runKey(q url.Values) (idem.Key, error) {
	key := idem.Key{Scope: q.Get("scope"), ID: q.Get("id")}
	switch {
	case key.Scope == "":
		return key, badf("scope", "missing: the run's key is its scope and id")
	case key.ID == "":
		return key, badf("id", "missing: the run's key is its scope and id")
	}
	if err := key.Validate(); err != nil {
		return key, badKey("scope and id", err)
	}
	return key, nil
}

// stepView is a step of the timeline: a completed step, or one that has only failed attempts
// so far (the step in progress, or the one that failed the run).
type stepView struct {
	Seq      int
	Name     string
	Kind     string
	Attempts int
	Output   []byte
	Error    string
	At       *time.Time
	Took     time.Duration // since the checkpoint before it (or the run's start)
	Copied   bool          // history copied by a fork: replayed, not run
	Done     bool
	Failures []workflow.AttemptRow
}

type runData struct {
	Run      *workflow.RunRow
	Key      idem.Key
	Act      *workflow.RunActivity
	Steps    []stepView
	Longest  time.Duration
	Attrs    []string
	TraceURL string
	Failed   int    // failed attempts in all
	Child    string // the ID of the child the run waits for, when it waits for one
}

// runGet reads the run under key, or answers 404 (no such run) or 500 and returns false.
func (h *Handler) runGet(w http.ResponseWriter, r *http.Request, key idem.Key) (*workflow.RunRow, bool) {
	run, err := h.engine.RunGet(r.Context(), key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, err.Error())
		return nil, false
	case err != nil:
		h.internal(w, r, err)
		return nil, false
	}
	return run, true
}

func (h *Handler) runPage(w http.ResponseWriter, r *http.Request) {
	key, err := runKey(r.URL.Query())
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	run, ok := h.runGet(w, r, key)
	if !ok {
		return
	}
	act, err := h.engine.RunActivity(r.Context(), key)
	if err != nil && !errors.Is(err, idem.ErrNotFound) { // reaped in between: shown without
		h.internal(w, r, err)
		return
	}
	if act == nil {
		act = &workflow.RunActivity{}
	}
	d := &runData{Run: run, Key: key, Act: act, Steps: timeline(run), TraceURL: h.traceURL(act.TraceID), Failed: len(run.Failures)}
	for _, s := range d.Steps {
		d.Longest = max(d.Longest, s.Took)
	}
	// A run that waits for its child awaits a signal named for the child (see steps.Child).
	if id, ok := strings.CutPrefix(run.AwaitingSignal, "child:"); ok &&
		slices.ContainsFunc(run.Children, func(c workflow.ChildRow) bool { return c.Key.ID == id }) {
		d.Child = id
	}
	for k, v := range run.Attributes {
		d.Attrs = append(d.Attrs, k+"="+v)
	}
	slices.Sort(d.Attrs)
	p := &page{Title: run.Workflow + " " + run.ID, Nav: "runs", Data: d}
	if !run.State.Finished() {
		p.Refresh = 2
	}
	h.render(w, r, http.StatusOK, "run", p)
}

// copiedSteps counts the steps at the head of a run's history that a fork copied from another
// run, as the run records it: they keep their own times, from before the fork made this run.
func copiedSteps(run *workflow.RunRow) int {
	if run.ForkedFrom == nil {
		return 0
	}
	return min(run.ForkedFrom.Steps, len(run.Steps))
}

// timeline puts a run's completed steps and its failed attempts in the order of its steps.
func timeline(run *workflow.RunRow) []stepView {
	var out []stepView
	prev := run.Created
	copied := copiedSteps(run)
	for i, s := range run.Steps {
		at := s.Created
		v := stepView{Seq: s.Seq, Name: s.Name, Kind: s.Kind, Attempts: s.Attempts, Output: s.Output, Error: s.Error, At: &at, Done: true,
			Copied: i < copied}
		if !v.Copied {
			v.Took = max(at.Sub(prev), 0)
			prev = at
		}
		out = append(out, v)
	}
	for _, a := range run.Failures {
		i := slices.IndexFunc(out, func(v stepView) bool { return v.Seq == a.Seq })
		if i < 0 {
			out = append(out, stepView{Seq: a.Seq, Name: a.Step, Kind: a.Kind})
			i = len(out) - 1
		}
		out[i].Failures = append(out[i].Failures, a)
	}
	slices.SortStableFunc(out, func(a, b stepView) int { return a.Seq - b.Seq })
	return out
}

// runJSON sends a run's whole input, output, or a step's output as a JSON file.
func (h *Handler) runJSON(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key, err := runKey(q)
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	part := q.Get("part")
	seq := 0
	if part == "step" {
		if seq, err = strconv.Atoi(q.Get("seq")); err != nil || seq < 1 {
			h.fail(w, r, http.StatusBadRequest, "seq: give the step's position, a number from 1")
			return
		}
	} else if part != "input" && part != "output" {
		h.fail(w, r, http.StatusBadRequest, "part: give input, output or step")
		return
	}
	run, ok := h.runGet(w, r, key)
	if !ok {
		return
	}
	var body []byte
	name := part
	switch part {
	case "input":
		body = run.Input
	case "output":
		body = run.Output
	default:
		i := slices.IndexFunc(run.Steps, func(s workflow.StepRow) bool { return s.Seq == seq })
		if i < 0 {
			h.fail(w, r, http.StatusNotFound, "the run has no completed step "+strconv.Itoa(seq))
			return
		}
		body, name = run.Steps[i].Output, "step-"+strconv.Itoa(seq)
	}
	if body == nil {
		h.fail(w, r, http.StatusNotFound, "the run has no "+part+" stored")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", `attachment; filename="run-`+name+`.json"`)
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(body)
}
