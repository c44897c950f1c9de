package idemcli_test

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/tx"
)

// TestOutboxCLI drives idem outbox list, show, retry and skip against messages a live relay
// refused: what an operator does when a key stops.
func TestOutboxCLI(t *testing.T) {
	t.Parallel()
	b := setup(t, build(t))
	require.NoError(t, idem.Migrate(b.ctx, b.pool))
	var fixed atomic.Bool
	pub := outbox.PublisherFunc(func(_ context.Context, e *outbox.Envelope) error {
		if e.Key != "ok" && !fixed.Load() {
			return errors.New("no route to " + e.Topic)
		}
		return nil
	})
	relay, err := outbox.NewRelay(b.pool, pub, &outbox.RelayOpts{Lease: 2 * time.Second, PollInterval: 20 * time.Millisecond, Logger: quiet(),
		Failure: &outbox.FailurePolicy{MaxAttempts: 2, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond},
		Topics:  map[string]*outbox.FailurePolicy{"audit": {MaxAttempts: 1, DeadLetter: true}}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var stopped, next, dead, published uuid.UUID
	require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
		ids, err := outbox.AppendBatch(ctx, t, []outbox.Message{
			{Topic: "orders", Key: "order-1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"Content-Type": "application/json"}},
			{Topic: "orders", Key: "order-1", Payload: []byte(`{"n":2}`)},
			{Topic: "audit", Key: "a", Payload: []byte{0xff, 0xfe}},
			{Topic: "orders", Key: "ok"},
		})
		if err == nil {
			stopped, next, dead, published = ids[0], ids[1], ids[2], ids[3]
		}
		return err
	}))
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := outbox.Counts(b.ctx, b.pool)
		require.NoError(t, err)
		if c[outbox.StatusStopped] == 1 && c[outbox.StatusDead] == 1 && c[outbox.StatusPublished] == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the relay did not stop the key: %v", c)
		time.Sleep(20 * time.Millisecond)
	}

	out := b.ok(t, "outbox", "list")
	require.Contains(t, out, "POS")
	require.Contains(t, out, stopped.String())
	require.Contains(t, out, "stopped")
	require.Contains(t, out, dead.String())
	require.Contains(t, out, "no route to orders")
	require.NotContains(t, out, published.String(), "by default, what needs an operator")
	require.Contains(t, b.ok(t, "outbox", "list", "--status", "published"), published.String())
	require.Contains(t, b.ok(t, "outbox", "list", "--status", "pending", "--key", "order-1"), next.String())
	require.Contains(t, b.ok(t, "outbox", "list", "--status", "all", "--limit", "1"), "more: --after")

	show := b.ok(t, "outbox", "show", stopped.String())
	for _, want := range [][2]string{{"status", "stopped"}, {"attempts", "2"}, {"header Content-Type", "application/json"}, {"payload", `{"n":1}`},
		{"key", "order-1"}, {"seq", "1"}, {"last error", "no route to orders"}} {
		require.Regexp(t, "(?m)^"+regexp.QuoteMeta(want[0])+" +"+regexp.QuoteMeta(want[1])+"$", show)
	}
	require.Contains(t, b.ok(t, "outbox", "show", dead.String()), "2 bytes", "a payload that is not text is shown by size")
	var info outbox.Info
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "outbox", "show", "--json", dead.String())), &info))
	require.Equal(t, outbox.StatusDead, info.Status)

	r := b.idem(t, "outbox", "skip", next.String())
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "is pending")
	r = b.idem(t, "outbox", "show", uuid.NewString())
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not in the outbox")
	for _, args := range [][]string{{"outbox", "show", "not-a-uuid"}, {"outbox", "list", "--status", "gone"}, {"outbox", "list", "--limit", "0"}, {"outbox", "retry"}} {
		r = b.idem(t, args...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
	}

	fixed.Store(true)
	require.Contains(t, b.ok(t, "outbox", "retry", stopped.String()), "will be published again")
	require.Contains(t, b.ok(t, "outbox", "skip", dead.String()), "is skipped")
	deadline = time.Now().Add(20 * time.Second)
	for {
		c, err := outbox.Counts(b.ctx, b.pool)
		require.NoError(t, err)
		if c[outbox.StatusPublished] == 3 {
			require.EqualValues(t, 1, c[outbox.StatusSkipped])
			break
		}
		require.True(t, time.Now().Before(deadline), "the retried key did not go on: %v", c)
		time.Sleep(20 * time.Millisecond)
	}
	require.True(t, strings.Contains(b.ok(t, "outbox", "list"), dead.String()), "a skipped message is listed until it is reaped")
	require.Contains(t, b.ok(t, "outbox", "--help"), "outbox retry ID")
}
