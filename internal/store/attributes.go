package store

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5"
)

// attributesArg is a run's attributes as a jsonb argument: NULL for none, so that a run without
// attributes has no entry in idem_runs_attributes.
func attributesArg(attrs map[string]string) any {
	if len(attrs) == 0 {
		return nil
	}
	data, _ := json.Marshal(attrs) // a map of strings always encodes
	return string(data)
}

// RunSetAttributesParams change a run's attributes: Set are added or replaced, Remove deleted.
// Max bounds how many the run may have afterwards.
type RunSetAttributesParams struct {
	LeaseParams
	Set    map[string]string
	Remove []string
	Max    int
}

// RunSetAttributesResult says what RunSetAttributes did: Set is false when nothing was written,
// because the caller does not hold the run's lease (Fenced) or because the run would have more
// than Max attributes (Count is how many it would have had).
type RunSetAttributesResult struct {
	Set    bool
	Fenced bool
	Count  int
}

// RunSetAttributes changes the attributes of a run whose lease the caller holds, in the caller's
// transaction (a step's, so that they commit with its checkpoint), unless the run would have more
// than p.Max attributes then. A run left without attributes stores NULL.
func (st *Statements) RunSetAttributes(ctx context.Context, q Querier, p RunSetAttributesParams) (RunSetAttributesResult, error) {
	remove := p.Remove
	if remove == nil {
		remove = []string{}
	}
	var r RunSetAttributesResult
	var count *int
	err := q.QueryRow(ctx, st.runs.setAttributes, p.Scope, p.ID, p.Token, attributesArg(p.Set), remove, p.Max).Scan(&r.Set, &count)
	if errors.Is(err, pgx.ErrNoRows) {
		return RunSetAttributesResult{Fenced: true}, nil
	}
	if count != nil {
		r.Count = *count
	}
	return r, err
}
