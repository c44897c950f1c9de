package idemui_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemui"
	"github.com/idemkit/idem/outbox"
)

// refuser is a broker that refuses the topics named in it, and takes the others.
type refuser struct {
	refuse atomic.Pointer[map[string]bool]
}

func (p *refuser) Publish(_ context.Context, batch []*outbox.Envelope) []error {
	errs := make([]error, len(batch))
	refuse := *p.refuse.Load()
	for i, e := range batch {
		if refuse[e.Topic] {
			errs[i] = errors.New("broker says no: <b>" + e.Topic + "</b>")
		}
	}
	return errs
}

// TestOutbox runs a relay against a broker that refuses two topics, one whose key stops and one
// that is dead-lettered, and reads the outbox's page, a message's, and retries and skips them.
func TestOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub := &refuser{}
	pub.refuse.Store(&map[string]bool{"orders.bad": true, "orders.dead": true})
	relay, err := outbox.NewRelay(b.pool, pub, &outbox.RelayOpts{Name: "relay-<1>", Lanes: 2, PollInterval: 10 * time.Millisecond,
		Topics: map[string]*outbox.FailurePolicy{"orders.bad": {MaxAttempts: 1}, "orders.dead": {MaxAttempts: 1, DeadLetter: true}},
		Logger: quiet()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	ids := map[string]uuid.UUID{}
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for _, m := range []outbox.Message{
			{Topic: "orders.ok", Key: "k-ok", Payload: []byte(`{"n":1}`)},
			{Topic: "orders.bad", Key: "k-bad", Payload: []byte(`{"n":2}`)},
			{Topic: "orders.ok", Key: "k-bad", Payload: []byte(`{"n":3}`)}, // waits behind the stopped one
			{Topic: "orders.dead", Key: "k-dead", Payload: []byte(`{"n":4}`)},
		} {
			id, err := outbox.Append(b.ctx, tx, m)
			if err != nil {
				return err
			}
			ids[m.Topic+"/"+string(m.Payload)] = id
		}
		return nil
	}))
	status := func(id uuid.UUID) outbox.Status {
		info, err := outbox.Get(b.ctx, b.pool, id)
		require.NoError(t, err)
		return info.Status
	}
	stopped, dead, behind := ids[`orders.bad/{"n":2}`], ids[`orders.dead/{"n":4}`], ids[`orders.ok/{"n":3}`]
	b.eventually(t, "one key stopped and one message dead", func() bool {
		return status(stopped) == outbox.StatusStopped && status(dead) == outbox.StatusDead
	})
	h := b.handler(t, &idemui.Options{AllowActions: true})

	res := get(t, h, "/outbox")
	require.Equal(t, http.StatusOK, res.status)
	msgs := between(t, res.body, `id="messages"`, `</table>`)
	require.Contains(t, msgs, stopped.String())
	require.Contains(t, msgs, dead.String())
	require.NotContains(t, msgs, behind.String(), "a pending message needs no operator")
	require.Contains(t, msgs, "broker says no: &lt;b&gt;orders.bad&lt;/b&gt;")
	require.Contains(t, between(t, res.body, `id="lanes"`, `</table>`), "relay-&lt;1&gt;", "the relay holds the lanes")
	res = get(t, h, "/outbox?status=pending")
	require.Contains(t, res.body, behind.String())
	res = get(t, h, "/outbox?status=all&key=k-ok")
	require.Contains(t, res.body, ids[`orders.ok/{"n":1}`].String())
	require.NotContains(t, res.body, stopped.String())

	res = get(t, h, "/outbox/message?message="+stopped.String())
	require.Equal(t, http.StatusOK, res.status)
	require.Contains(t, res.body, `id="state">stopped<`)
	require.Contains(t, res.body, `&#34;n&#34;: 2`)
	require.Contains(t, res.body, "action=outbox-skip")

	for path, want := range map[string]int{
		"/outbox?status=bogus":                         http.StatusBadRequest,
		"/outbox?after=x":                              http.StatusBadRequest,
		"/outbox/message?message=nope":                 http.StatusBadRequest,
		"/outbox/message":                              http.StatusBadRequest,
		"/outbox/message?message=" + uuid.Nil.String(): http.StatusNotFound,
	} {
		require.Equal(t, want, get(t, h, path).status, path)
	}

	// Skip the stopped message: its key goes on with the next one.
	token, cookie := confirm(t, h, "action=outbox-skip&message="+stopped.String())
	res = post(t, h, "/action", url.Values{"action": {"outbox-skip"}, "message": {stopped.String()}, "csrf": {token}},
		map[string]string{"Cookie": cookie})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	require.Equal(t, outbox.StatusSkipped, status(stopped))
	b.eventually(t, "the stopped key goes on", func() bool { return status(behind) == outbox.StatusPublished })

	// Retry the dead letter once the broker takes its topic: it is published.
	pub.refuse.Store(&map[string]bool{})
	res = post(t, h, "/action", url.Values{"action": {"outbox-retry"}, "message": {dead.String()}, "csrf": {token}},
		map[string]string{"Cookie": cookie})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	b.eventually(t, "the retried message is published", func() bool { return status(dead) == outbox.StatusPublished })
	require.Contains(t, b.log.String(), `action=outbox-retry user=unknown message=`+dead.String())

	// A published message can be neither: 409, with the outbox's reason.
	res = post(t, h, "/action", url.Values{"action": {"outbox-skip"}, "message": {dead.String()}, "csrf": {token}},
		map[string]string{"Cookie": cookie})
	require.Equal(t, http.StatusConflict, res.status)
	require.Contains(t, res.body, "was published")
	res = get(t, h, "/outbox")
	require.Contains(t, res.body, stopped.String(), "a skipped message stays in view (the outbox's list of those that need an operator)")
	require.False(t, strings.Contains(res.body, dead.String()), "a published one does not")
}
