package store

// ListRunsSQL is the statement RunList sends for f, for the test that EXPLAINs it.
func (st *Statements) ListRunsSQL(f RunFilter) (string, []any) { return st.listRuns(f) }
