package idemui

import (
	"net/http"
	"strings"

	"github.com/idemkit/idem/workflow"
)

type schedulesData struct {
	Workflow  string
	After     string
	Schedules []*workflow.ScheduleRow
	Next      string
}

func (h *Handler) schedulesPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := &schedulesData{Workflow: q.Get("workflow"), After: q.Get("after")}
	params := &workflow.ScheduleListParams{After: d.After, Limit: h.opts.PageSize}
	if strings.ContainsFunc(d.Workflow, hidden) {
		h.badRequest(w, r, badf("workflow", "%q has a control character; a workflow's name has none", d.Workflow))
		return
	}
	for wf := range strings.SplitSeq(d.Workflow, ",") {
		if wf = strings.TrimSpace(wf); wf != "" {
			params.Workflows = append(params.Workflows, wf)
		}
	}
	res, err := h.engine.ScheduleList(r.Context(), params)
	if err != nil && d.After != "" && strings.Contains(err.Error(), "ScheduleListParams.After") {
		err = badf("after", "%q is not a schedule's name", d.After)
	}
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	d.Schedules, d.Next = res.Schedules, res.Next
	h.render(w, r, http.StatusOK, "schedules", &page{Title: "Schedules", Nav: "schedules", Data: d})
}
