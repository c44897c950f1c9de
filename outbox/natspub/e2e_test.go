package natspub_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/outboxcheck"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/natspub"
)

// e2eMessages is how many messages TestEndToEnd sends: 20,000 by default, to keep CI quick;
// IDEM_OUTBOX_E2E_MESSAGES=100000 runs the full count.
func e2eMessages(t *testing.T) int {
	if s := os.Getenv("IDEM_OUTBOX_E2E_MESSAGES"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "IDEM_OUTBOX_E2E_MESSAGES")
		return n
	}
	return 20000
}

// TestEndToEnd appends messages over 1,000 keys from 8 writers, relays them to JetStream with
// two relays, and reads the stream: nothing lost, every key in order, repeats only under the
// same id; the stream and Postgres count the same.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.consume(t)
	b.relay(t, "a")
	b.relay(t, "b")
	n := e2eMessages(t)
	start := time.Now()
	ids := writers(t, b.ctx, &outboxcheck.Writer{DB: b.pool, Topic: "events.e2e", Keys: 1000, PerTx: 10, Payload: make([]byte, 256)}, 8, n)
	b.waitPublished(t, int64(len(ids)), 5*time.Minute)
	waitFor(t, time.Minute, "the consumer to read them", func() bool { return b.ledger.Distinct() >= len(ids) })
	r := b.ledger.Check(ids)
	require.True(t, r.OK(), r.String())
	require.EqualValues(t, len(ids), b.streamCount(t), "JetStream stored each message once")
	t.Logf("%d messages in %s: %s", len(ids), time.Since(start).Round(time.Millisecond), r)
}

// TestBrokerRestart restarts NATS twice while writers append and a relay publishes: the relay
// waits for it, and nothing is lost or reordered.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.relay(t, "a")
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	done := make(chan []uuid.UUID)
	go func() {
		done <- writers(t, ctx, &outboxcheck.Writer{DB: b.pool, Topic: "events.restart", Keys: 100, PerTx: 5}, 4, 4000)
	}()
	for range 2 {
		time.Sleep(400 * time.Millisecond)
		require.NoError(t, b.nats.Restart())
	}
	ids := <-done
	b.waitPublished(t, int64(len(ids)), 2*time.Minute)
	b.consume(t)
	waitFor(t, time.Minute, "the consumer to read them", func() bool { return b.ledger.Distinct() >= len(ids) })
	r := b.ledger.Check(ids)
	require.True(t, r.OK(), r.String())
	c, err := outbox.Counts(b.ctx, b.pool)
	require.NoError(t, err)
	require.Zero(t, c[outbox.StatusStopped]+c[outbox.StatusDead], "a restart stops no key")
	t.Logf("%d messages across two restarts: %s", len(ids), r)
}

// TestUnknownSubjectStopsItsKey publishes to a subject no stream captures: JetStream answers
// nothing, the key stops after its attempts (never silently dropped), and the others go on.
func TestUnknownSubjectStopsItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.relay(t, "a")
	lost := &outboxcheck.Writer{DB: b.pool, Topic: "nowhere.x", Keys: 1, Prefix: "lost-"}
	_, err := lost.Write(b.ctx, 2)
	require.NoError(t, err)
	ids := writers(t, b.ctx, &outboxcheck.Writer{DB: b.pool, Topic: "events.ok", Keys: 10}, 2, 100)
	b.waitPublished(t, int64(len(ids)), time.Minute)
	waitFor(t, 30*time.Second, "the key to stop", func() bool {
		c, err := outbox.Counts(b.ctx, b.pool)
		require.NoError(t, err)
		return c[outbox.StatusStopped] == 1 && c[outbox.StatusPending] == 1
	})
	page, err := outbox.List(b.ctx, b.pool, &outbox.ListParams{Status: outbox.StatusStopped})
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Contains(t, page[0].LastError, "no response from stream")
	require.EqualValues(t, len(ids), b.streamCount(t))
}

// TestPublisher checks the publisher alone: headers, and a PubAck marked duplicate counts as
// published.
func TestPublisher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub := natspub.New(b.js, &natspub.Opts{Subject: func(topic string) string { return "events." + topic }})
	e := &outbox.Envelope{ID: uuid.Must(uuid.NewV7()), Topic: "t", Key: "k", Seq: 7, Payload: []byte("p"), Headers: map[string]string{"Content-Type": "text/plain"}}
	require.Nil(t, pub.Publish(b.ctx, []*outbox.Envelope{e})[0])
	require.Nil(t, pub.Publish(b.ctx, []*outbox.Envelope{e})[0], "a duplicate is published")
	require.EqualValues(t, 1, b.streamCount(t), "and stored once")
	msg, err := b.stream.GetMsg(b.ctx, 1)
	require.NoError(t, err)
	require.Equal(t, "events.t", msg.Subject)
	require.Equal(t, []byte("p"), msg.Data)
	for k, v := range map[string]string{jetstream.MsgIDHeader: e.ID.String(), outbox.HeaderID: e.ID.String(), outbox.HeaderKey: "k", outbox.HeaderSeq: "7", "Content-Type": "text/plain"} {
		require.Equal(t, v, msg.Header.Get(k), k)
	}

	b.nc.Close()
	err = pub.Publish(b.ctx, []*outbox.Envelope{e})[0]
	require.ErrorIs(t, err, outbox.ErrUnavailable, "a closed connection is an unavailable broker")
	require.ErrorIs(t, err, nats.ErrConnectionClosed)
}

// childEnv makes the test binary a relay process, for TestRelayKilledBeforeMark.
const childEnv = "IDEM_NATSPUB_CHILD"

// runChild is a relay that SIGKILLs itself right after JetStream acknowledged its first batch,
// before it can record that batch as published.
func runChild() int {
	ctx := context.Background()
	pool, err := newPool(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pub := natspub.New(js, nil)
	killing := publisherFunc(func(ctx context.Context, batch []*outbox.Envelope) []error {
		errs := pub.Publish(ctx, batch)
		fmt.Printf("acked %d\n", len(batch))
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		return errs
	})
	relay, err := outbox.NewRelay(pool, killing, &outbox.RelayOpts{Name: "doomed", Lease: time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	err = relay.Run(ctx)
	fmt.Fprintln(os.Stderr, err)
	return 1
}

type publisherFunc func(ctx context.Context, batch []*outbox.Envelope) []error

func (f publisherFunc) Publish(ctx context.Context, batch []*outbox.Envelope) []error {
	return f(ctx, batch)
}

// TestRelayKilledBeforeMark runs a relay in a child process that dies by SIGKILL between
// JetStream's PubAck and its own record of the batch. The next relay publishes the batch again,
// under the same ids: JetStream drops the repeats (its duplicate window), so the stream holds
// each message once.
func TestRelayKilledBeforeMark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := writers(t, b.ctx, &outboxcheck.Writer{DB: b.pool, Topic: "events.kill", Keys: 20, PerTx: 10}, 1, 200)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "DATABASE_URL="+b.pool.Config().ConnString(), "NATS_URL="+b.nats.ClientURL())
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stdout %s stderr %s", out.String(), stderr.String())
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal(), "the relay died by SIGKILL: %s", stderr.String())
	require.Contains(t, out.String(), "acked")

	stored := b.streamCount(t)
	c, err := outbox.Counts(b.ctx, b.pool)
	require.NoError(t, err)
	require.Positive(t, stored, "JetStream has the batch")
	require.Zero(t, c[outbox.StatusPublished], "the relay died before recording it")

	b.relay(t, "next")
	b.waitPublished(t, int64(len(ids)), time.Minute)
	require.EqualValues(t, len(ids), b.streamCount(t), "the repeats were dropped as duplicates: each message is stored once")
	b.consume(t)
	waitFor(t, 30*time.Second, "the consumer to read them", func() bool { return b.ledger.Distinct() >= len(ids) })
	r := b.ledger.Check(ids)
	require.True(t, r.OK(), r.String())
	require.Zero(t, r.Repeats)
	t.Logf("%d messages were at the broker before the kill; %s", stored, r)
}
