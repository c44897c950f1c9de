package idemui_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemui"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/workflow"
)

func TestActions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fixture(t)
	h := b.handler(t, &idemui.Options{AllowActions: true, User: func(r *http.Request) string { return r.Header.Get("X-User") }})
	wait := idem.Key{Scope: "customer:bob", ID: "w-1"}
	cancelForm := func(token string) url.Values {
		return url.Values{"action": {"cancel"}, "scope": {wait.Scope}, "id": {wait.ID}, "reason": {"customer asked"}, "csrf": {token}}
	}

	t.Run("Buttons", func(t *testing.T) {
		res := get(t, h, "/run?scope=customer:bob&id=w-1")
		require.Contains(t, res.body, `href="/confirm?action=cancel&amp;id=w-1&amp;scope=customer%3Abob"`)
		require.Contains(t, res.body, "actions on")
		res = get(t, h, "/run?scope=customer:bob&id=p-1")
		require.NotContains(t, res.body, "action=cancel", "a done run cannot be cancelled")
		require.Contains(t, res.body, "action=fork")
	})

	t.Run("Refused", func(t *testing.T) {
		token, cookie := confirm(t, h, "action=cancel&scope=customer:bob&id=w-1")
		_, otherCookie := confirm(t, h, "action=cancel&scope=customer:bob&id=w-1")
		for name, tc := range map[string]struct {
			form   url.Values
			header map[string]string
			want   string
		}{
			"NoToken":          {cancelForm(""), map[string]string{"Cookie": cookie}, "CSRF token is missing"},
			"ForgedToken":      {cancelForm("AAAA" + token[4:]), map[string]string{"Cookie": cookie}, "CSRF token does not match"},
			"OtherCookie":      {cancelForm(token), map[string]string{"Cookie": otherCookie}, "CSRF token does not match"},
			"NoCookie":         {cancelForm(token), nil, "CSRF cookie is missing"},
			"CrossSite":        {cancelForm(token), map[string]string{"Cookie": cookie, "Sec-Fetch-Site": "cross-site"}, "from another site or origin (Sec-Fetch-Site: cross-site"},
			"SameSiteNotSame":  {cancelForm(token), map[string]string{"Cookie": cookie, "Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site: same-site"},
			"OtherOrigin":      {cancelForm(token), map[string]string{"Cookie": cookie, "Origin": "https://evil.example"}, "Origin: https://evil.example"},
			"TokenOfOtherView": {cancelForm(otherViewToken(t, b)), map[string]string{"Cookie": cookie}, "CSRF token does not match"},
		} {
			res := post(t, h, "/action", tc.form, tc.header)
			require.Equal(t, http.StatusForbidden, res.status, name)
			require.Contains(t, res.body, tc.want, name)
			require.Equal(t, "awaiting", b.state(t, wait), "%s: nothing changed", name)
		}
		res := get(t, h, "/action?action=cancel")
		require.Equal(t, http.StatusMethodNotAllowed, res.status)
		require.Equal(t, "awaiting", b.state(t, wait))
	})

	t.Run("BadForm", func(t *testing.T) {
		token, cookie := confirm(t, h, "action=cancel&scope=customer:bob&id=w-1")
		form := cancelForm(token)
		form.Set("reason", " ")
		res := post(t, h, "/action", form, map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, res.body, "reason: missing")
		require.Contains(t, res.body, `name="csrf"`, "the form again, to correct")
		require.Equal(t, "awaiting", b.state(t, wait))

		form = cancelForm(token)
		form.Set("action", "drop-table")
		res = post(t, h, "/action", form, map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, res.body, "action: &#34;drop-table&#34; is not an action")
		require.Equal(t, http.StatusBadRequest, get(t, h, "/confirm?action=nope").status)
	})

	t.Run("Cancel", func(t *testing.T) {
		token, cookie := confirm(t, h, "action=cancel&scope=customer:bob&id=w-1")
		res := post(t, h, "/action", cancelForm(token), map[string]string{"Cookie": cookie, "Sec-Fetch-Site": "same-origin",
			"Origin": "https://ops.example.com", "X-User": "ops@example.com"})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		require.Equal(t, "/run?id=w-1&scope=customer%3Abob&done=cancel", res.header.Get("Location"))
		// (Sec-Fetch-Site: same-origin is the browser's word; an Origin that differs from Host, as
		// behind a proxy that rewrites Host, does not overrule it.)
		require.Equal(t, "cancelled", b.state(t, wait))
		run, err := b.engine.RunGet(b.ctx, wait)
		require.NoError(t, err)
		require.Equal(t, "customer asked", run.Error)
		require.Contains(t, b.log.String(), `msg="idemui: action" action=cancel user=ops@example.com scope=customer:bob key_hash=`+
			redact.Hash("customer:bob", "w-1")+` reason="customer asked"`, "the key's hash, not its ID, as in idem's other records")
		require.NotContains(t, b.log.String(), "w-1")
		res = get(t, h, res.header.Get("Location"))
		require.Contains(t, res.body, "The run was cancelled.")

		// Again: the engine refuses nothing (a cancelled run's cancel is a no-op); a done run's is
		// refused with the engine's reason, 409, and the form again.
		token, cookie = confirm(t, h, "action=cancel&scope=customer:bob&id=p-1")
		form := cancelForm(token)
		form.Set("id", "p-1")
		res = post(t, h, "/action", form, map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusConflict, res.status)
		require.Contains(t, res.body, "is done and cannot be cancelled")
		require.Equal(t, "done", b.state(t, idem.Key{Scope: "customer:bob", ID: "p-1"}))
	})

	t.Run("ResumeAndFork", func(t *testing.T) {
		failed := idem.Key{Scope: "customer:eve", ID: "f-1"}
		token, cookie := confirm(t, h, "action=resume&scope=customer:eve&id=f-1")
		res := post(t, h, "/action", url.Values{"action": {"resume"}, "scope": {failed.Scope}, "id": {failed.ID}, "csrf": {token}},
			map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		// The resume job runs the failing step again, which fails again.
		b.eventually(t, "the resumed run fails again", func() bool {
			run, err := b.engine.RunGet(b.ctx, failed)
			require.NoError(t, err)
			return run.State == workflow.RunStateFailed && len(run.Failures) == 2
		})

		token, cookie = confirm(t, h, "action=fork&scope=customer:bob&id=p-1")
		form := url.Values{"action": {"fork"}, "scope": {"customer:bob"}, "id": {"p-1"}, "csrf": {token}, "from_step": {"x"}, "new_id": {"p-1b"}}
		res = post(t, h, "/action", form, map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, res.body, "from_step: &#34;x&#34; is not a step&#39;s position")
		form.Set("from_step", "3")
		res = post(t, h, "/action", form, map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		require.Equal(t, "/run?done=fork&id=p-1b&scope=customer%3Abob", res.header.Get("Location"))
		fork := idem.Key{Scope: "customer:bob", ID: "p-1b"}
		b.eventually(t, "the fork is done", func() bool { return b.state(t, fork) == "done" })
		res = get(t, h, "/run?scope=customer:bob&id=p-1b")
		require.Equal(t, 2, strings.Count(res.body, `title="copied from the run it was forked from`), "two steps replayed")
		require.Contains(t, res.body, `id="forked"><a href="/run?id=p-1&amp;scope=customer%3Abob">p-1</a>, its first 2 steps copied</dd>`)

		res = post(t, h, "/action", form, map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusConflict, res.status, "the new key is taken now")
		require.Contains(t, res.body, "is taken")
	})

	t.Run("KeyDelete", func(t *testing.T) {
		key := idem.Key{Scope: "customer:alice", ID: "t-1"}
		_, err := idem.Run(b.ctx, b.pool, key, func(ctx context.Context, _ pgx.Tx) (int, error) { return 1, nil })
		require.NoError(t, err)
		res := get(t, h, "/keys?scope=customer:alice&id=t-1")
		require.Contains(t, res.body, "action=key-delete")
		token, cookie := confirm(t, h, "action=key-delete&scope=customer:alice&id=t-1")
		res = post(t, h, "/action", url.Values{"action": {"key-delete"}, "scope": {key.Scope}, "id": {key.ID}, "csrf": {token}},
			map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		_, err = idem.KeyGet(b.ctx, b.pool, key)
		require.ErrorIs(t, err, idem.ErrNotFound)

		// With RecordKeys the log names the key itself.
		recorded := b.handler(t, &idemui.Options{AllowActions: true, RecordKeys: true})
		other := idem.Key{Scope: "customer:alice", ID: "t-2"}
		_, err = idem.Run(b.ctx, b.pool, other, func(ctx context.Context, _ pgx.Tx) (int, error) { return 1, nil })
		require.NoError(t, err)
		token2, cookie2 := confirm(t, recorded, "action=key-delete&scope=customer:alice&id=t-2")
		res = post(t, recorded, "/action", url.Values{"action": {"key-delete"}, "scope": {other.Scope}, "id": {other.ID}, "csrf": {token2}},
			map[string]string{"Cookie": cookie2})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		require.Contains(t, b.log.String(), `action=key-delete user=unknown scope=customer:alice id=t-2`)

		// A run's key is the run's: refused, and kept.
		res = post(t, h, "/action", url.Values{"action": {"key-delete"}, "scope": {"customer:bob"}, "id": {"p-2"}, "csrf": {token}},
			map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusConflict, res.status)
		require.Contains(t, res.body, "belongs to a run")
		_, err = idem.KeyGet(b.ctx, b.pool, idem.Key{Scope: "customer:bob", ID: "p-2"})
		require.NoError(t, err)
	})

	t.Run("Schedules", func(t *testing.T) {
		require.NoError(t, payWF.Schedule(b.ctx, b.engine, "nightly", 5, &workflow.ScheduleOpts{Cron: "0 2 * * *"}))
		res := get(t, h, "/schedules")
		require.Contains(t, res.body, "nightly")
		require.Contains(t, res.body, "<code>0 2 * * *</code>")
		require.Contains(t, res.body, "action=schedule-pause")

		token, cookie := confirm(t, h, "action=schedule-pause&name=nightly")
		res = post(t, h, "/action", url.Values{"action": {"schedule-pause"}, "name": {"nightly"}, "note": {"holiday <b>"}, "csrf": {token}},
			map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		s, err := b.engine.ScheduleGet(b.ctx, "nightly")
		require.NoError(t, err)
		require.True(t, s.Paused)
		res = get(t, h, "/schedules")
		require.Contains(t, res.body, "paused</span> holiday &lt;b&gt;")
		require.Contains(t, res.body, "action=schedule-resume")

		res = post(t, h, "/action", url.Values{"action": {"schedule-trigger"}, "name": {"nightly"}, "csrf": {token}},
			map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		loc, err := url.Parse(res.header.Get("Location"))
		require.NoError(t, err)
		require.Equal(t, "/run", loc.Path)
		require.True(t, strings.HasPrefix(loc.Query().Get("id"), "sched/nightly/"))

		res = post(t, h, "/action", url.Values{"action": {"schedule-resume"}, "name": {"nobody"}, "csrf": {token}},
			map[string]string{"Cookie": cookie})
		require.Equal(t, http.StatusNotFound, res.status)
		require.Contains(t, res.body, "no schedule is named")
	})
}

// otherViewToken is a token another Handler (of the same engine) signed: its key is not ours.
func otherViewToken(t testing.TB, b *testBundle) string {
	t.Helper()
	token, _ := confirm(t, b.handler(t, &idemui.Options{AllowActions: true}), "action=cancel&scope=customer:bob&id=w-1")
	return token
}
