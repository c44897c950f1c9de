package idemui_test

import (
	"context"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemui"
	"github.com/idemkit/idem/tx"
	"github.com/idemkit/idem/workflow"
)

func TestPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fixture(t)
	h := b.handler(t, nil)

	t.Run("Root", func(t *testing.T) {
		res := get(t, h, "/")
		require.Equal(t, http.StatusFound, res.status)
		require.Equal(t, "/runs", res.header.Get("Location"))
	})

	t.Run("RunsList", func(t *testing.T) {
		res := get(t, h, "/runs")
		require.Equal(t, http.StatusOK, res.status)
		require.Equal(t, "text/html; charset=utf-8", res.header.Get("Content-Type"))
		require.Contains(t, res.header.Get("Content-Security-Policy"), "script-src 'self'")
		for _, id := range []string{"p-1", "p-2", "f-1", "w-1"} {
			require.Contains(t, res.body, `href="/run?id=`+id+`&amp;scope=customer`, "a link to "+id)
		}
		require.Contains(t, res.body, "card declined")
		require.Contains(t, res.body, `all <b>4</b>`)
		require.Contains(t, res.body, `done <b>2</b>`)
		require.Contains(t, res.body, `failed <b>1</b>`)
		require.Contains(t, res.body, `awaiting <b>1</b>`)
		require.Contains(t, res.body, "read-only")
		require.NotContains(t, res.body, "/confirm", "no action without AllowActions")
	})

	t.Run("Filters", func(t *testing.T) {
		res := get(t, h, "/runs?state=failed")
		require.Equal(t, http.StatusOK, res.status)
		require.Contains(t, res.body, "f-1")
		require.NotContains(t, res.body, "p-1")
		require.Contains(t, res.body, `<option value="failed" selected>`)

		res = get(t, h, "/runs?workflow=pay&scope=customer:bob")
		require.Contains(t, res.body, "p-1")
		require.NotContains(t, res.body, "w-1")
		require.NotContains(t, res.body, "f-1")

		res = get(t, h, "/runs?state=done,awaiting&since=1h")
		require.Contains(t, res.body, "w-1")
		require.Contains(t, res.body, "p-2")
		require.NotContains(t, res.body, "f-1")

		res = get(t, h, "/runs?until=2000-01-01")
		require.Contains(t, res.body, "No runs match these filters.")
	})

	t.Run("Paging", func(t *testing.T) {
		res := get(t, h, "/runs?limit=3")
		require.Equal(t, http.StatusOK, res.status)
		require.Equal(t, 3, strings.Count(res.body, `class="run"`))
		next := between(t, res.body, `id="next" href="`, `"`)
		res = get(t, h, strings.ReplaceAll(next, "&amp;", "&"))
		require.Equal(t, http.StatusOK, res.status)
		require.Equal(t, 1, strings.Count(res.body, `class="run"`), "the fourth run, on the second page")
		require.Contains(t, res.body, "p-1", "the oldest")
		require.Contains(t, res.body, "first page")
		require.NotContains(t, res.body, `id="next"`)
	})

	t.Run("Run", func(t *testing.T) {
		res := get(t, h, "/run?scope=customer:eve&id=f-1")
		require.Equal(t, http.StatusOK, res.status)
		require.Contains(t, res.body, `id="state">failed<`)
		require.Contains(t, res.body, "first")
		require.Contains(t, res.body, "second")
		require.Contains(t, res.body, `tag-permanent">permanent<`, "the failed attempt, with its outcome")
		require.Contains(t, res.body, "card declined")
		require.NotContains(t, res.body, `data-refresh`, "a finished run is not reloaded")

		res = get(t, h, "/run?scope=customer:bob&id=p-1")
		require.Contains(t, res.body, `id="state">done<`)
		require.Contains(t, res.body, "<progress", "the steps' durations")
		require.NotContains(t, res.body, `title="copied from`, "a run's first step is its own, though stamped before the run")
		require.Contains(t, res.body, "&#34;charge&#34;: &#34;ch_", "the output, pretty")

		res = get(t, h, "/run?scope=customer:bob&id=w-1")
		require.Contains(t, res.body, `data-refresh="2"`, "an unfinished run reloads")
		require.Contains(t, res.body, `<noscript><meta http-equiv="refresh" content="2"></noscript>`)
		require.Contains(t, res.body, "signal <b>go</b>", "what it waits for")
		require.Contains(t, res.body, "waiting for go", "its event")
	})

	t.Run("Trace", func(t *testing.T) {
		_, err := b.pool.Exec(b.ctx, `UPDATE idem_runs SET trace_context = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' WHERE id = 'p-2'`)
		require.NoError(t, err)
		traced := b.handler(t, &idemui.Options{TraceURL: "https://tracing.example.com/trace/{trace_id}?from=idem"})
		res := get(t, traced, "/run?scope=customer:bob&id=p-2")
		require.Contains(t, res.body, `<a href="https://tracing.example.com/trace/0af7651916cd43dd8448eb211c80319c?from=idem">0af7651916cd43dd8448eb211c80319c</a>`)
		res = get(t, h, "/run?scope=customer:bob&id=p-2")
		require.Contains(t, res.body, `<dt>trace</dt><dd>0af7651916cd43dd8448eb211c80319c</dd>`, "the id alone without a TraceURL")
	})

	t.Run("Download", func(t *testing.T) {
		res := get(t, h, "/run/json?scope=customer:bob&id=p-1&part=input")
		require.Equal(t, http.StatusOK, res.status)
		require.Equal(t, "70", res.body)
		require.Contains(t, res.header.Get("Content-Disposition"), "attachment")
		res = get(t, h, "/run/json?scope=customer:bob&id=p-1&part=step&seq=1")
		require.Equal(t, "70", res.body)
		require.Equal(t, http.StatusBadRequest, get(t, h, "/run/json?scope=customer:bob&id=p-1&part=secret").status)
		require.Equal(t, http.StatusNotFound, get(t, h, "/run/json?scope=customer:bob&id=p-1&part=step&seq=9").status)
	})

	t.Run("Clipped", func(t *testing.T) {
		long := strings.Repeat("declined ", 40)
		_, err := failWF.Run(b.ctx, b.engine, idem.Key{Scope: "customer:eve", ID: "f-long"}, long, nil)
		require.ErrorIs(t, err, workflow.ErrFailed)
		small := b.handler(t, &idemui.Options{ClipBytes: 64})
		res := get(t, small, "/run?scope=customer:eve&id=f-long")
		require.Equal(t, http.StatusOK, res.status)
		input := between(t, res.body, `<pre class="json">`, `</pre>`)
		require.Less(t, len(input), 80, "the input is clipped at 64 bytes")
		require.True(t, strings.HasSuffix(input, "…"))
		require.Contains(t, res.body, "download all 362 B")
		res = get(t, small, "/run/json?scope=customer:eve&id=f-long&part=input")
		require.Equal(t, `"`+long+`"`, res.body, "the whole value")
	})

	t.Run("Keys", func(t *testing.T) {
		res := get(t, h, "/keys")
		require.Equal(t, http.StatusOK, res.status)
		require.Contains(t, res.body, `id="lookup"`)

		res = get(t, h, "/keys?scope=customer:bob&id=p-1")
		require.Equal(t, http.StatusOK, res.status)
		require.Contains(t, res.body, "a run of <b>pay</b> (done)")
		require.Contains(t, res.body, `href="/run?id=p-1&amp;scope=customer%3Abob"`)

		_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: "customer:alice", ID: "t-1", Fingerprint: idem.Fingerprint("a")},
			func(ctx context.Context, _ pgx.Tx) (map[string]string, error) {
				return map[string]string{"secret": "only-for-the-client"}, nil
			})
		require.NoError(t, err)
		res = get(t, h, "/keys?scope=customer:alice&id=t-1")
		require.Equal(t, http.StatusOK, res.status)
		require.Contains(t, res.body, "idem.Do")
		require.Contains(t, res.body, hex.EncodeToString(idem.Fingerprint("a")))
		require.Contains(t, res.body, "32 B (not shown")
		require.NotContains(t, res.body, "only-for-the-client", "a key's stored result is never shown")
	})

	t.Run("KeyList", func(t *testing.T) {
		res := get(t, h, "/keys?scope=customer:bob")
		require.Equal(t, http.StatusOK, res.status)
		for _, id := range []string{"p-1", "p-2", "w-1"} {
			require.Contains(t, res.body, `href="/keys?id=`+id+`&amp;scope=customer%3Abob"`)
		}
		require.Contains(t, res.body, `run of pay <span class="state state-done">done</span>`)
		res = get(t, h, "/keys?scope=customer:bob&prefix=p-")
		require.Contains(t, res.body, "p-2")
		require.NotContains(t, res.body, "w-1")
		res = get(t, h, "/keys?scope=customer:nobody")
		require.Contains(t, res.body, "No keys in this scope.")

		paged := b.handler(t, &idemui.Options{PageSize: 1})
		res = get(t, paged, "/keys?scope=customer:bob")
		require.Equal(t, 1, strings.Count(res.body, `class="key"`))
		res = get(t, paged, strings.ReplaceAll(between(t, res.body, `id="next" href="`, `"`), "&amp;", "&"))
		require.Equal(t, http.StatusOK, res.status)
		require.Contains(t, res.body, "p-2", "the second key, by id")
	})

	t.Run("StoredResponse", func(t *testing.T) {
		mw, err := idemhttp.Middleware(b.pool, &idemhttp.Config{Scope: func(*http.Request) string { return "customer:carol" }})
		require.NoError(t, err)
		api := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"api_key":"sk_live_only_once"}`))
		}))
		req := httptest.NewRequest(http.MethodPost, "/keys", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "create-1")
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		require.Equal(t, http.StatusCreated, rec.Code)

		res := get(t, h, "/keys?scope=customer:carol&id=create-1")
		require.Equal(t, http.StatusOK, res.status)
		require.Contains(t, res.body, `<b id="status">HTTP 201 Created</b>`)
		require.NotContains(t, res.body, "sk_live", "the stored body is not shown by default")
		require.NotContains(t, res.body, `id="result"`)

		shown := b.handler(t, &idemui.Options{ShowResults: true})
		res = get(t, shown, "/keys?scope=customer:carol&id=create-1")
		require.Contains(t, res.body, `id="result"`)
		require.Contains(t, res.body, `&#34;status&#34;: 201`)
	})

	t.Run("NotFound", func(t *testing.T) {
		res := get(t, h, "/run?scope=customer:bob&id=nobody")
		require.Equal(t, http.StatusNotFound, res.status)
		require.Contains(t, res.body, `no run has key &#34;nobody&#34;`)
		res = get(t, h, "/keys?scope=customer:bob&id=nobody")
		require.Equal(t, http.StatusNotFound, res.status)
		require.Contains(t, res.body, "is not stored")
		require.Equal(t, http.StatusNotFound, get(t, h, "/nothing-here").status)
	})

	t.Run("BadInput", func(t *testing.T) {
		for path, field := range map[string]string{
			"/runs?state=bogus":            "state: &#34;bogus&#34; is not a run state",
			"/runs?limit=abc":              "limit: &#34;abc&#34; is not a page size",
			"/runs?limit=100000":           "limit: &#34;100000&#34; is not a page size",
			"/runs?since=yesterday":        "since: &#34;yesterday&#34; is not a time",
			"/runs?until=2026-13-45":       "until: &#34;2026-13-45&#34; is not a time",
			"/runs?after=garbage":          "after: not a cursor of this list",
			"/runs?attr=noequals":          "attr: &#34;noequals&#34; is not key=value",
			"/runs?attr=k%3Dv%07":          "attr: value of &#34;k&#34; has control character U&#43;0007",
			"/runs?scope=%01":              "scope: Scope has control character U&#43;0001",
			"/run?id=p-1":                  "scope: missing",
			"/run?scope=customer:bob":      "id: missing",
			"/run?scope=s&id=has%20space":  "scope and id: ID has byte 0x20",
			"/keys?id=x":                   "scope: missing",
			"/keys?scope=s&after=junk":     "after: not a cursor of this list",
			"/keys?scope=s&prefix=a%20b":   "prefix: cannot start a key&#39;s ID",
			"/schedules?after=%20":         "after: &#34; &#34; is not a schedule&#39;s name",
			"/run/json?scope=s&id=x&part=": "part: give input, output or step",
		} {
			res := get(t, h, path)
			require.Equal(t, http.StatusBadRequest, res.status, path)
			require.Contains(t, res.body, field, path)
		}
	})

	t.Run("Schedules", func(t *testing.T) {
		res := get(t, h, "/schedules")
		require.Equal(t, http.StatusOK, res.status)
		require.Contains(t, res.body, "No schedules.")
	})
}

// TestRunRelations shows what a run has to do with others: the signals it was sent and
// consumed, and its children and parent.
func TestRunRelations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.handler(t, nil)
	wait := idem.Key{Scope: "customer:bob", ID: "w-1"}
	b.startWaiting(t, wait)
	require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
		_, err := b.engine.SignalTx(ctx, t, wait, "go", "<b>go</b>", &workflow.SignalOpts{DedupeID: "evt-1"})
		return err
	}))
	b.eventually(t, "the run consumes its signal", func() bool { return b.state(t, wait) == "done" })
	res := get(t, h, "/run?scope=customer:bob&id=w-1")
	require.Contains(t, res.body, `id="signals"`)
	require.Contains(t, res.body, "by step 2", "consumed by the await")
	require.Contains(t, res.body, "evt-1")
	require.Contains(t, res.body, `&#34;\u003cb\u003ego\u003c/b\u003e&#34;`, "the payload, as JSON, escaped")

	_, err := parentWF.Run(b.ctx, b.engine, idem.Key{Scope: "customer:bob", ID: "parent-1"}, 9, &workflow.RunOpts{Wait: 15 * time.Second})
	require.NoError(t, err)
	res = get(t, h, "/run?scope=customer:bob&id=parent-1")
	require.Contains(t, res.body, `id="children"`)
	child := between(t, between(t, res.body, `id="children"`, `</table>`), `<a href="`, `"`)
	res = get(t, h, strings.ReplaceAll(child, "&amp;", "&"))
	require.Equal(t, http.StatusOK, res.status)
	require.Contains(t, res.body, `<dt>parent</dt><dd><a href="/run?id=parent-1&amp;scope=customer%3Abob">parent-1</a> (step 1)</dd>`)

	// A parent that waits for its child says so, with a link to the child.
	waiting := idem.Key{Scope: "customer:bob", ID: "parent-2"}
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return parentWaitWF.StartTx(b.ctx, b.engine, tx, waiting, 1) }))
	b.eventually(t, "the parent waits for its child", func() bool { return b.state(t, waiting) == "awaiting" })
	res = get(t, h, "/run?scope=customer:bob&id=parent-2")
	require.Contains(t, between(t, res.body, `id="waits">`, `</dd>`), `its child <a href="/run?id=`)
}

// TestVersions shows the code versions runs started on (workflow.Config.Version), filters by
// them, and a run whose code diverged from its history.
func TestVersions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fixture(t)
	v2, err := workflow.NewEngine(b.pool, &workflow.Config{Workflows: []workflow.Definition{payWF}, Version: "v2.<b>", Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = v2.Close() })
	_, err = payWF.Run(b.ctx, v2, idem.Key{Scope: "customer:dan", ID: "p-v2"}, 5, nil)
	require.NoError(t, err)
	h := b.handler(t, nil)

	res := get(t, h, "/runs?version="+url.QueryEscape("v2.<b>"))
	require.Equal(t, http.StatusOK, res.status)
	require.Contains(t, res.body, "p-v2")
	require.NotContains(t, res.body, "p-1", "runs of other versions are left out")
	require.Contains(t, res.body, "v2.&lt;b&gt;")
	require.Equal(t, http.StatusBadRequest, get(t, h, "/runs?version=%07").status)

	res = get(t, h, "/run?scope=customer:dan&id=p-v2")
	require.Contains(t, between(t, res.body, `id="version">`, `</dd>`), "v2.&lt;b&gt;</a>")

	_, err = b.pool.Exec(b.ctx, `UPDATE idem_runs SET state = 'failed', output = '{"error":"diverged","reason":"nondeterministic",`+
		`"divergence":{"seq":2,"stored_kind":"sleep","stored_name":"cool-off","called_kind":"call","called_name":"fraud-check"}}' WHERE id = 'p-v2'`)
	require.NoError(t, err)
	res = get(t, h, "/run?scope=customer:dan&id=p-v2")
	require.Contains(t, res.body, `id="divergence">at step 2: the history has sleep <b>cool-off</b>, the code called call <b>fraud-check</b></dd>`)
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := idem.Key{Scope: "customer:bob", ID: "w-1"}
	b.startWaiting(t, key)
	h := b.handler(t, nil)

	res := get(t, h, "/confirm?action=cancel&scope=customer:bob&id=w-1")
	require.Equal(t, http.StatusForbidden, res.status)
	require.Contains(t, res.body, "read-only")

	// Even with what would be a good token from a handler that allows actions.
	token, cookie := confirm(t, b.handler(t, &idemui.Options{AllowActions: true}), "action=cancel&scope=customer:bob&id=w-1")
	res = post(t, h, "/action", url.Values{"action": {"cancel"}, "scope": {key.Scope}, "id": {key.ID}, "reason": {"x"}, "csrf": {token}},
		map[string]string{"Cookie": cookie})
	require.Equal(t, http.StatusForbidden, res.status)
	require.Equal(t, "awaiting", b.state(t, key), "nothing changed")
	require.Contains(t, b.log.String(), "action refused")
}

func TestNewHandlerOptions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		opts *idemui.Options
		want string
	}{
		{&idemui.Options{Prefix: "ops"}, "Prefix must start with a slash"},
		{&idemui.Options{Prefix: "/ops/"}, "Prefix must start with a slash and not end with one"},
		{&idemui.Options{Prefix: "/o\"ps"}, "Prefix must be a plain path"},
		{&idemui.Options{TraceURL: "https://t/"}, "TraceURL must hold {trace_id}"},
		{&idemui.Options{ClipBytes: -1}, "ClipBytes cannot be negative"},
		{&idemui.Options{PageSize: 5000}, "PageSize must be between 1 and 1000"},
	} {
		_, err := idemui.NewHandler(b.engine, tc.opts)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := idemui.NewHandler(nil, nil)
	require.ErrorContains(t, err, "engine cannot be nil")
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fixture(t)
	h := b.handler(t, &idemui.Options{Prefix: "/ops/idem"})
	mux := http.NewServeMux()
	mux.Handle("/ops/idem/", h)
	mux.Handle("/ops/idem", h)

	res := get(t, mux, "/ops/idem")
	require.Equal(t, http.StatusFound, res.status)
	require.Equal(t, "/ops/idem/runs", res.header.Get("Location"))
	res = get(t, mux, "/ops/idem/runs")
	require.Equal(t, http.StatusOK, res.status)
	require.Contains(t, res.body, `href="/ops/idem/run?id=p-1&amp;scope=customer%3Abob"`)
	require.Contains(t, res.body, `href="/ops/idem/static/style.css"`)
	require.Equal(t, http.StatusOK, get(t, mux, "/ops/idem/static/app.js").status)
	require.Equal(t, http.StatusNotFound, get(t, h, "/runs").status, "a path outside the prefix")
	require.Equal(t, http.StatusNotFound, get(t, h, "/ops/idemx/runs").status)
}

// between is the text of s between the first start and the end after it.
func between(t testing.TB, s, start, end string) string {
	t.Helper()
	_, rest, ok := strings.Cut(s, start)
	require.True(t, ok, "%q in the page", start)
	v, _, ok := strings.Cut(rest, end)
	require.True(t, ok)
	return v
}
