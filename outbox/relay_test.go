package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/outboxcheck"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/tx"
)

func TestRelay(t *testing.T) {
	t.Parallel()

	t.Run("DeliversInKeyOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, b.sink(), b.opts("r1"))
		w := &outboxcheck.Writer{DB: b.pool, Topic: "t", Keys: 50, PerTx: 5}
		ids, err := w.Write(b.ctx, 2000)
		require.NoError(t, err)
		w.Keys = 0 // and some without a key
		more, err := w.Write(b.ctx, 100)
		require.NoError(t, err)
		ids = append(ids, more...)
		b.waitPublished(t, int64(len(ids)))
		r := b.checkLedger(t, ids)
		require.Equal(t, len(ids), r.Distinct)
		require.Equal(t, map[outbox.Status]int64{outbox.StatusPublished: int64(len(ids))}, b.counts(t))
	})

	// Two writers of one key: A begins and writes first, B appends and commits, then A appends
	// and commits. B's message is published first: commit order, where the order of the
	// transactions' starts, ids or xids would put A first.
	t.Run("CommitOrderInversion", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(b.ctx, `CREATE TABLE business (id int PRIMARY KEY, n int)`)
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `INSERT INTO business VALUES (1, 0), (2, 0)`)
		require.NoError(t, err)
		b.run(t, b.sink(), b.opts("r1"))

		a, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = a.Rollback(b.ctx) }()
		_, err = a.Exec(b.ctx, `UPDATE business SET n = n + 1 WHERE id = 1`) // A has the older xid
		require.NoError(t, err)
		var idB uuid.UUID
		require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			if _, err := t.Exec(ctx, `UPDATE business SET n = n + 1 WHERE id = 2`); err != nil {
				return err
			}
			idB, err = outbox.Append(ctx, t, outbox.Message{Topic: "t", Key: "k", Payload: []byte("B")})
			return err
		}))
		idA, err := outbox.Append(b.ctx, a, outbox.Message{Topic: "t", Key: "k", Payload: []byte("A")})
		require.NoError(t, err)
		require.NoError(t, a.Commit(b.ctx))

		b.waitPublished(t, 2)
		got := b.ledger.Keys("k")
		require.Len(t, got, 2)
		require.Equal(t, []string{idB.String(), idA.String()}, []string{got[0].ID, got[1].ID}, "published in commit order")
		require.Equal(t, []int64{1, 2}, []int64{got[0].Seq, got[1].Seq})
	})

	// A writer that appended and waits holds its key's next writer, which then comes after it.
	t.Run("SecondWriterComesAfter", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, b.sink(), b.opts("r1"))
		first, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = first.Rollback(b.ctx) }()
		id1, err := outbox.Append(b.ctx, first, outbox.Message{Topic: "t", Key: "k"})
		require.NoError(t, err)
		second := make(chan uuid.UUID, 1)
		go func() {
			var id uuid.UUID
			_ = pgx.BeginFunc(b.ctx, b.pool, func(t pgx.Tx) error {
				var err error
				id, err = outbox.Append(b.ctx, t, outbox.Message{Topic: "t", Key: "k"})
				return err
			})
			second <- id
		}()
		holder := first.Conn().PgConn().PID()
		waitFor(t, 10*time.Second, "the second writer to wait on the key", func() bool {
			var waiting bool
			err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::int4 = ANY(pg_blocking_pids(pid)))`, holder).Scan(&waiting)
			return err == nil && waiting
		})
		require.NoError(t, first.Commit(b.ctx))
		id2 := <-second
		b.waitPublished(t, 2)
		got := b.ledger.Keys("k")
		require.Equal(t, []string{id1.String(), id2.String()}, []string{got[0].ID, got[1].ID})
	})

	t.Run("RolledBackWriterPublishesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, b.sink(), b.opts("r1"))
		rolled, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		gone, err := outbox.Append(b.ctx, rolled, outbox.Message{Topic: "t", Key: "k"})
		require.NoError(t, err)
		require.NoError(t, rolled.Rollback(b.ctx))
		w := &outboxcheck.Writer{DB: b.pool, Topic: "t", Keys: 1}
		ids, err := w.Write(b.ctx, 3)
		require.NoError(t, err)
		b.waitPublished(t, 3)
		b.checkLedger(t, ids)
		require.False(t, b.ledger.Has(gone.String()))
		require.Equal(t, 3, b.ledger.Distinct())
	})

	// A session that wrote something and sits idle in transaction delays nothing: not the
	// messages appended and committed while it is open, nor its own message once it commits.
	t.Run("IdleInTransactionDoesNotStall", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(b.ctx, `CREATE TABLE business (id int PRIMARY KEY)`)
		require.NoError(t, err)
		b.run(t, b.sink(), b.opts("r1"))
		idle, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = idle.Rollback(b.ctx) }()
		_, err = idle.Exec(b.ctx, `INSERT INTO business VALUES (1)`)
		require.NoError(t, err)
		own, err := outbox.Append(b.ctx, idle, outbox.Message{Topic: "t", Key: "idle"})
		require.NoError(t, err)

		held := time.Now()
		w := &outboxcheck.Writer{DB: b.pool, Topic: "t", Keys: 20, PerTx: 10}
		var ids []uuid.UUID
		for range 5 {
			more, err := w.Write(b.ctx, 100)
			require.NoError(t, err)
			ids = append(ids, more...)
			b.waitPublished(t, int64(len(ids)))
			time.Sleep(300 * time.Millisecond)
		}
		require.Less(t, time.Since(held), 10*time.Second)
		b.checkLedger(t, ids)
		require.False(t, b.ledger.Has(own.String()), "its own message waits for its COMMIT")
		require.NoError(t, idle.Commit(b.ctx))
		waitFor(t, 10*time.Second, "the late committer's message", func() bool { return b.ledger.Has(own.String()) })
	})

	// The broker refuses one key's message: that key stops after its attempts, its later
	// messages wait, every other key goes on; an operator's retry lets it go on in order.
	t.Run("PoisonMessageStopsItsKeyOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var refuse atomic.Bool
		refuse.Store(true)
		var attempts atomic.Int64
		pub := outbox.PublisherFunc(func(_ context.Context, e *outbox.Envelope) error {
			if e.Key == "poison" && refuse.Load() {
				attempts.Add(1)
				return errors.New("no route to subject")
			}
			b.ledger.RecordEnvelope(e)
			return nil
		})
		opts := b.opts("r1")
		opts.Failure.MaxAttempts = 3
		b.run(t, pub, opts)
		var poisoned []uuid.UUID
		require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			poisoned = nil
			for i := range 3 {
				id, err := outbox.Append(ctx, t, outbox.Message{Topic: "t", Key: "poison", Payload: []byte{byte(i)}})
				if err != nil {
					return err
				}
				poisoned = append(poisoned, id)
			}
			return nil
		}))
		w := &outboxcheck.Writer{DB: b.pool, Topic: "t", Keys: 10, PerTx: 10}
		ids, err := w.Write(b.ctx, 200)
		require.NoError(t, err)
		b.waitPublished(t, int64(len(ids)))
		b.checkLedger(t, ids)

		waitFor(t, 10*time.Second, "the key to stop", func() bool { return b.counts(t)[outbox.StatusStopped] == 1 })
		require.EqualValues(t, 3, attempts.Load())
		require.True(t, b.logs.contains("key stopped"), "a log line says the key stopped")
		info, err := outbox.Get(b.ctx, b.pool, poisoned[0])
		require.NoError(t, err)
		require.Equal(t, outbox.StatusStopped, info.Status)
		require.Equal(t, 3, info.Attempts)
		require.Equal(t, "no route to subject", info.LastError)
		page, err := outbox.List(b.ctx, b.pool, nil)
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, poisoned[0], page[0].ID)
		require.Empty(t, b.ledger.Keys("poison"))

		err = outbox.Skip(b.ctx, b.pool, poisoned[1])
		require.ErrorContains(t, err, "pending", "only the stopped head can be skipped")
		refuse.Store(false) // the cause is fixed
		require.NoError(t, outbox.Retry(b.ctx, b.pool, poisoned[0]))
		b.waitPublished(t, int64(len(ids)+3))
		got := b.ledger.Keys("poison")
		require.Len(t, got, 3)
		for i, d := range got {
			require.Equal(t, poisoned[i].String(), d.ID, "in order once retried")
		}
		err = outbox.Retry(b.ctx, b.pool, poisoned[0])
		require.ErrorContains(t, err, "was published")
	})

	// A broker's error is stored as text: one that is long, not UTF-8 or holds a NUL byte is
	// recorded all the same (cut short, made valid), and does not keep the relay from
	// recording anything else.
	t.Run("AnyErrorTextIsRecorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// 1000 three-byte runes: a cut at 2000 bytes falls inside one.
		long := "\x00\xff" + strings.Repeat("€", 1000)
		pub := outbox.PublisherFunc(func(_ context.Context, e *outbox.Envelope) error {
			if e.Key == "poison" {
				return errors.New(long)
			}
			b.ledger.RecordEnvelope(e)
			return nil
		})
		opts := b.opts("r1")
		opts.Failure.MaxAttempts = 1
		b.run(t, pub, opts)
		err := tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
			_, err := outbox.Append(ctx, t, outbox.Message{Topic: "t", Key: "poison"})
			return err
		})
		require.NoError(t, err)
		poisoned, err := outbox.List(b.ctx, b.pool, &outbox.ListParams{Status: "all"})
		require.NoError(t, err)
		require.Len(t, poisoned, 1)
		w := &outboxcheck.Writer{DB: b.pool, Topic: "t", Keys: 5}
		ids, err := w.Write(b.ctx, 20)
		require.NoError(t, err)
		b.waitPublished(t, int64(len(ids)))
		waitFor(t, 10*time.Second, "the key to stop", func() bool { return b.counts(t)[outbox.StatusStopped] == 1 })
		info, err := outbox.Get(b.ctx, b.pool, poisoned[0].ID)
		require.NoError(t, err)
		require.True(t, utf8.ValidString(info.LastError))
		require.True(t, strings.HasPrefix(info.LastError, "\uFFFD"), "invalid bytes are replaced: %q", info.LastError[:10])
		require.LessOrEqual(t, len(info.LastError), 2100)
	})

	t.Run("SkipAndDeadLetter", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pub := outbox.PublisherFunc(func(_ context.Context, e *outbox.Envelope) error {
			if string(e.Payload) == "bad" {
				return errors.New("message too large")
			}
			b.ledger.RecordEnvelope(e)
			return nil
		})
		opts := b.opts("r1")
		opts.Failure.MaxAttempts = 2
		opts.Topics = map[string]*outbox.FailurePolicy{"audit": {MaxAttempts: 2, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond, DeadLetter: true}}
		b.run(t, pub, opts)
		appendAll := func(topic string, payloads ...string) []uuid.UUID {
			var ids []uuid.UUID
			require.NoError(t, tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
				ids = nil
				for _, p := range payloads {
					id, err := outbox.Append(ctx, t, outbox.Message{Topic: topic, Key: topic, Payload: []byte(p)})
					if err != nil {
						return err
					}
					ids = append(ids, id)
				}
				return nil
			}))
			return ids
		}
		stopped := appendAll("orders", "bad", "ok")
		dead := appendAll("audit", "bad", "ok")
		waitFor(t, 10*time.Second, "the dead letter and the stop", func() bool {
			c := b.counts(t)
			return c[outbox.StatusDead] == 1 && c[outbox.StatusStopped] == 1 && c[outbox.StatusPublished] == 1
		})
		require.Equal(t, []string{dead[1].String()}, ids(b.ledger.Keys("audit")), "the dead letter's key went on")
		require.NoError(t, outbox.Skip(b.ctx, b.pool, stopped[0]))
		waitFor(t, 10*time.Second, "the skipped key to go on", func() bool { return b.ledger.Has(stopped[1].String()) })
		deadPage, err := outbox.List(b.ctx, b.pool, &outbox.ListParams{Status: outbox.StatusDead})
		require.NoError(t, err)
		require.Len(t, deadPage, 1)
		require.Equal(t, dead[0], deadPage[0].ID)
		_, err = outbox.List(b.ctx, b.pool, &outbox.ListParams{Status: "gone"})
		require.ErrorContains(t, err, "not a status")
	})

	// A broker that cannot be reached pauses the relay; the wait does not count as attempts.
	t.Run("UnavailableBrokerIsWaitedFor", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var down atomic.Bool
		down.Store(true)
		var refused atomic.Int64
		pub := outbox.PublisherFunc(func(_ context.Context, e *outbox.Envelope) error {
			if down.Load() {
				refused.Add(1)
				return outbox.Unavailable(errors.New("connection refused"))
			}
			b.ledger.RecordEnvelope(e)
			return nil
		})
		opts := b.opts("r1")
		opts.Failure.MaxAttempts = 1
		b.run(t, pub, opts)
		w := &outboxcheck.Writer{DB: b.pool, Topic: "t", Keys: 5}
		ids, err := w.Write(b.ctx, 20)
		require.NoError(t, err)
		waitFor(t, 10*time.Second, "the relay to try", func() bool { return refused.Load() >= 3 })
		down.Store(false)
		b.waitPublished(t, 20)
		b.checkLedger(t, ids)
		require.Zero(t, b.counts(t)[outbox.StatusStopped], "an outage stops no key")
		require.True(t, b.logs.contains("broker is unavailable"))
	})
}

func ids(ds []outboxcheck.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

// TestRelaysShareLanes runs two relays while a writer appends, has a third join and leave, and
// checks that the lanes were shared and every key stayed in order.
func TestRelaysShareLanes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stopA := b.run(t, b.sink(), b.opts("a"))
	b.run(t, b.sink(), b.opts("b"))

	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var (
		mu  sync.Mutex
		all []uuid.UUID
		wg  sync.WaitGroup
	)
	for range 2 {
		wg.Go(func() {
			w := &outboxcheck.Writer{DB: b.pool, Topic: "t", Keys: 200, PerTx: 5}
			for ctx.Err() == nil {
				ids, err := w.Write(ctx, 50)
				mu.Lock()
				all = append(all, ids...)
				mu.Unlock()
				if err != nil && ctx.Err() == nil {
					t.Errorf("writer: %v", err)
					return
				}
			}
		})
	}
	owners := func() map[string]int {
		lanes, err := outbox.Lanes(b.ctx, b.pool)
		require.NoError(t, err)
		n := map[string]int{}
		for _, l := range lanes {
			if l.Expires != nil && time.Until(*l.Expires) > 0 {
				n[l.Owner]++
			}
		}
		return n
	}
	waitFor(t, 10*time.Second, "two relays to split the lanes", func() bool {
		o := owners()
		return o["a"] == 8 && o["b"] == 8
	})
	stopC := b.run(t, b.sink(), b.opts("c"))
	waitFor(t, 10*time.Second, "the third to take its share", func() bool {
		o := owners()
		return o["a"] == 6 && o["b"] == 5 && o["c"] == 5
	})
	stopC()
	waitFor(t, 10*time.Second, "its lanes to come back", func() bool {
		o := owners()
		return o["a"] == 8 && o["b"] == 8
	})
	stopA()
	waitFor(t, 10*time.Second, "b to hold every lane", func() bool { return owners()["b"] == 16 })
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	b.waitPublished(t, int64(len(all)))
	r := b.checkLedger(t, all)
	t.Logf("%d messages: %s", len(all), r)
}

// TestStaleRelayCannotMark takes a relay's lanes away while its batch is at the broker, as a
// relay that stalled past its lease would find them: it records nothing for them, and the relay
// that takes them publishes the messages again, with the same ids, in order.
func TestStaleRelayCannotMark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	var held atomic.Int64
	stalled := outbox.PublisherFunc(func(ctx context.Context, e *outbox.Envelope) error {
		held.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		b.ledger.RecordEnvelope(e)
		return nil
	})
	opts := b.opts("stale")
	opts.Lanes = 4
	b.run(t, stalled, opts)
	w := &outboxcheck.Writer{DB: b.pool, Topic: "t", Keys: 8}
	ids, err := w.Write(b.ctx, 8)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the batch to reach the broker", func() bool { return held.Load() > 0 })

	// Another relay takes every lane over (the stale one's lease ran out, by the database's say).
	_, err = b.pool.Exec(b.ctx, `UPDATE idem_outbox_lanes SET owner = 'thief', token = gen_random_uuid(), expires_at = now() + interval '1 hour'`)
	require.NoError(t, err)
	close(release)
	waitFor(t, 10*time.Second, "the stale relay to lose its lanes", func() bool { return b.logs.contains("relay lost a lane") })
	require.Zero(t, b.counts(t)[outbox.StatusPublished], "the stale relay marked nothing")

	_, err = b.pool.Exec(b.ctx, `UPDATE idem_outbox_lanes SET owner = NULL, token = NULL, expires_at = NULL`)
	require.NoError(t, err)
	next := b.opts("next")
	next.Lanes = 4
	b.run(t, b.sink(), next)
	b.waitPublished(t, int64(len(ids)))
	r := b.checkLedger(t, ids)
	require.Positive(t, r.Repeats, "published again, under the same ids")
}

func TestRelayOpts(t *testing.T) {
	t.Parallel()
	pub := outbox.PublisherFunc(func(context.Context, *outbox.Envelope) error { return nil })
	for _, c := range []struct {
		opts *outbox.RelayOpts
		want string
	}{
		{&outbox.RelayOpts{Lease: 10 * time.Millisecond}, "RelayOpts.Lease cannot be less than 1s"},
		{&outbox.RelayOpts{BatchSize: -1}, "RelayOpts.BatchSize cannot be negative"},
		{&outbox.RelayOpts{Lanes: 5000}, "RelayOpts.Lanes cannot be more than 4096"},
		{&outbox.RelayOpts{MaxPending: 10, BatchSize: 20}, "MaxPending (10) cannot be less than BatchSize (20)"},
		{&outbox.RelayOpts{Failure: &outbox.FailurePolicy{MinBackoff: time.Second, MaxBackoff: time.Millisecond}}, "RelayOpts.Failure.MaxBackoff (1ms) cannot be less than MinBackoff (1s)"},
		{&outbox.RelayOpts{Topics: map[string]*outbox.FailurePolicy{"x": {MaxAttempts: -1}}}, `RelayOpts.Topics["x"].MaxAttempts cannot be negative`},
	} {
		_, err := outbox.NewRelay(struct{ outbox.Querier }{}, pub, c.opts)
		require.ErrorContains(t, err, c.want)
	}
	_, err := outbox.NewRelay(nil, pub, nil)
	require.ErrorContains(t, err, "db is nil")

	b := setup(t)
	relay, err := outbox.NewRelay(b.pool, pub, &outbox.RelayOpts{Lanes: 4})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	other, err := outbox.NewRelay(b.pool, pub, &outbox.RelayOpts{Lanes: 8})
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the lanes", func() bool { l, _ := outbox.Lanes(b.ctx, b.pool); return len(l) == 4 })
	require.ErrorContains(t, other.Run(b.ctx), "RelayOpts.Lanes is 8, but the outbox has 4 lanes")
	require.ErrorContains(t, relay.Run(b.ctx), "already running")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	missing, err := outbox.NewRelay(b.pool, pub, &outbox.RelayOpts{Schema: "nowhere"})
	require.NoError(t, err)
	require.ErrorContains(t, missing.Run(b.ctx), "run idem.Migrate first")
}
