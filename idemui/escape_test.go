package idemui_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemui"
)

// TestHostileStrings stores HTML, script, quotes and control characters wherever a run, a key
// and a schedule hold text, with plain SQL (so that nothing the API checks on the way in stops
// them), and reads every page: they come out as text.
func TestHostileStrings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		script = `<script>alert(1)</script>`
		attr   = `"><img src=x onerror=alert(2)>`
		quotes = `it's "quoted"`
		ctrl   = "bell\x07 esc\x1b[31m rtl\u202egnp.exe"
	)
	hostile := script + attr + quotes + ctrl
	id := `<script>x</script>"'` // printable ASCII: a valid key ID
	scope := `scope<b>"` + "'"
	input, _ := json.Marshal(map[string]string{"note": hostile})
	_, err := b.pool.Exec(b.ctx, `INSERT INTO idem_keys (scope, id, workflow, created_at, expires_at) VALUES ($1, $2, $3, now(), 'infinity')`,
		scope, id, hostile)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO idem_runs (scope, id, workflow, state, input, output, last_error, attempts, lease_owner, lease_expires_at, attributes,
	trace_context, wait_name, wake_at)
VALUES ($1, $2, $3, 'awaiting', $4, NULL, $5, 1, $5, now() + interval '1 minute', jsonb_build_object('k', $5::text), $5, $5, now() + interval '1 hour')`,
		scope, id, hostile, input, hostile)
	require.NoError(t, err)
	for _, sql := range []string{
		`INSERT INTO idem_steps (scope, id, seq, name, kind, output, error) VALUES ($1, $2, 1, $3, 'tx', $4, NULL), ($1, $2, 2, $3, $3, NULL, $3)`,
		`INSERT INTO idem_step_attempts (scope, id, seq, name, kind, attempt, outcome, error) VALUES ($1, $2, 3, $3, $3, 1, $3, $3)`,
		`INSERT INTO idem_signals (scope, id, name, payload, dedupe_id) VALUES ($1, $2, $3, $4, $3)`,
		`INSERT INTO idem_events (scope, id, name, value) VALUES ($1, $2, $3, $4)`,
		`INSERT INTO idem_schedules (name, workflow, scope, cron, time_zone, input, overlap, catch_up, paused, pause_note, next_tick, last_run_id)
	VALUES ('<script>s</script>', $3, $1, $3, $3, $4, 'skip', 'latest', true, $3, now(), $2)`,
	} {
		args := []any{scope, id, hostile, input}
		if !strings.Contains(sql, "$4") {
			args = args[:3]
		}
		_, err = b.pool.Exec(b.ctx, sql, args...)
		require.NoError(t, err, sql)
	}

	h := b.handler(t, &idemui.Options{AllowActions: true})
	q := url.Values{"scope": {scope}, "id": {id}}.Encode()
	for _, path := range []string{
		"/runs",
		"/runs?workflow=" + url.QueryEscape(hostile),
		"/run?" + q,
		"/keys?" + q,
		"/keys?scope=" + url.QueryEscape(scope),
		"/schedules",
		"/confirm?action=cancel&" + q,
		"/confirm?action=schedule-resume&name=" + url.QueryEscape("<script>s</script>"),
		"/run?scope=" + url.QueryEscape(scope) + "&id=" + url.QueryEscape(`<script>nobody</script>`),
	} {
		res := get(t, h, path)
		require.Contains(t, []int{http.StatusOK, http.StatusNotFound, http.StatusBadRequest}, res.status, path)
		for _, raw := range []string{"<script>alert", "<script>x", "<script>s", "<script>nobody", "<img", "scope<b>", "\x07", "\x1b", "\u202e"} {
			require.NotContains(t, res.body, raw, "%s shows %q as markup or raw", path, raw)
		}
		require.Contains(t, res.body, "&lt;script&gt;", path)
		switch path {
		case "/run?" + q, "/schedules": // the list clips these strings before their end
			require.Contains(t, res.body, `\u0007`, "%s shows control characters as escapes", path)
			require.Contains(t, res.body, `\u202e`, path)
		}
	}
	res := get(t, h, "/run?"+q)
	require.Contains(t, res.body, "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x onerror=alert(2)&gt;it&#39;s &#34;quoted&#34;")
	require.Equal(t, 1, strings.Count(res.body, "<script"), "the page's own script only")
}
