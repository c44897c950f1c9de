package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/outboxcheck"
	"github.com/idemkit/idem/outbox"
)

func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	ledger *outboxcheck.Ledger
	logs   *logBuffer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), pool: idemtest.NewPool(t, nil), ledger: outboxcheck.NewLedger(), logs: &logBuffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			b.logs.mu.Lock()
			defer b.logs.mu.Unlock()
			t.Logf("relay logs:\n%s", b.logs.buf.String())
		}
	})
	return b
}

// sink is a publisher that records every message in the ledger, as a broker that acknowledges
// everything would.
func (b *testBundle) sink() outbox.Publisher {
	return outbox.PublisherFunc(func(_ context.Context, e *outbox.Envelope) error {
		b.ledger.RecordEnvelope(e)
		return nil
	})
}

// opts are relay options quick enough for tests: a short lease, frequent polls.
func (b *testBundle) opts(name string) *outbox.RelayOpts {
	return &outbox.RelayOpts{
		Name: name, Lease: 2 * time.Second, PollInterval: 20 * time.Millisecond,
		Failure: &outbox.FailurePolicy{MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond},
		Logger:  slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// run runs a relay until the returned function is called (or the test ends), and then waits for
// Run to return.
func (b *testBundle) run(t *testing.T, pub outbox.Publisher, opts *outbox.RelayOpts) (stop func()) {
	t.Helper()
	relay, err := outbox.NewRelay(b.pool, pub, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("relay %s: %v", relay.Name(), err)
				}
			case <-time.After(45 * time.Second):
				t.Errorf("relay %s did not stop", relay.Name())
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond until it holds, for at most limit.
var waitFor = outboxcheck.WaitFor

// counts reads the outbox's counts by status.
func (b *testBundle) counts(t *testing.T) map[outbox.Status]int64 {
	t.Helper()
	c, err := outbox.Counts(b.ctx, b.pool)
	require.NoError(t, err)
	return c
}

// waitPublished waits until n messages are recorded as published.
func (b *testBundle) waitPublished(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for b.counts(t)[outbox.StatusPublished] < n {
		if time.Now().After(deadline) {
			var pending []*outbox.Info
			for after := int64(0); ; {
				page, _ := outbox.List(b.ctx, b.pool, &outbox.ListParams{Status: "all", After: after, Limit: 1000})
				if len(page) == 0 {
					break
				}
				for _, p := range page {
					if p.Status == outbox.StatusPending && len(pending) < 20 {
						pending = append(pending, p)
					}
				}
				after = page[len(page)-1].Position
			}
			lanes, _ := outbox.Lanes(b.ctx, b.pool)
			for _, p := range pending {
				t.Logf("pending: %s pos %d key %q seq %d attempts %d in ledger %v", p.ID, p.Position, p.Key, p.Seq, p.Attempts, b.ledger.Has(p.ID.String()))
			}
			for _, l := range lanes {
				t.Logf("lane %d: owner %q floor %d oldest %v", l.Lane, l.Owner, l.Floor, l.Oldest)
			}
			t.Fatalf("gave up after a minute waiting for %d messages to be published: %v", n, b.counts(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkLedger requires every id in the ledger, each key in order.
func (b *testBundle) checkLedger(t *testing.T, ids []uuid.UUID) outboxcheck.Report {
	t.Helper()
	r := b.ledger.Check(ids)
	require.True(t, r.OK(), r.String())
	return r
}

// logBuffer collects a relay's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.buf.String(), s)
}
