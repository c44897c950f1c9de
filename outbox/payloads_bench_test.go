package outbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/outbox"
)

// BenchmarkRelayLargeBodies measures how fast a relay publishes 2,000 messages with 4 KiB
// bodies over 100 keys, appended in one transaction, to a publisher that acknowledges
// everything: with the bodies in today's partition ("partition": each read is Fetch and one
// more statement), or in their rows ("inline": written as before, see SetPayloadInlineMax). One
// iteration is one backlog, from its COMMIT to its last acknowledgement, the variants in turn:
//
//	go test -run '^$' -bench RelayLargeBodies -benchtime 10x -count 3 ./outbox/
func BenchmarkRelayLargeBodies(b *testing.B) {
	const (
		backlog = 2000
		size    = 4 << 10
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type variant struct {
		pool      *pgxpool.Pool
		published atomic.Int64
	}
	variants := map[string]*variant{}
	for _, mode := range []string{"partition", "inline"} {
		v := &variant{pool: idemtest.NewPool(b, nil)}
		pub := outbox.PublisherFunc(func(_ context.Context, e *outbox.Envelope) error {
			if len(e.Payload) != size {
				return errors.New("wrong body")
			}
			v.published.Add(1)
			return nil
		})
		relay, err := outbox.NewRelay(v.pool, pub, &outbox.RelayOpts{Name: mode, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = relay.Run(ctx)
		}()
		b.Cleanup(func() { cancel(); <-done })
		variants[mode] = v
	}
	body := randomBody(size)
	msgs := make([]outbox.Message, backlog)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "t", Key: "k" + strconv.Itoa(i%100), Payload: body}
	}
	b.Run("4KiB", func(b *testing.B) {
		var (
			elapsed [2]time.Duration
			n       [2]int
		)
		modes := [2]string{"partition", "inline"}
		for i := 0; b.Loop(); i++ {
			which := i % 2
			v := variants[modes[which]]
			b.StopTimer()
			want := v.published.Load() + backlog
			restore := func() {}
			if which == 1 {
				restore = store.SetPayloadInlineMax(1 << 30)
			}
			err := pgx.BeginFunc(ctx, v.pool, func(t pgx.Tx) error {
				_, err := outbox.AppendBatch(ctx, t, msgs)
				return err
			})
			restore()
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			b.StartTimer()
			deadline := start.Add(time.Minute)
			for v.published.Load() < want {
				if time.Now().After(deadline) {
					b.Fatalf("%d of %d published after a minute", v.published.Load()-want+backlog, backlog)
				}
				time.Sleep(200 * time.Microsecond)
			}
			elapsed[which] += time.Since(start)
			n[which]++
		}
		var rate [2]float64
		for w := range 2 {
			rate[w] = float64(n[w]*backlog) / max(elapsed[w].Seconds(), 1e-9)
			b.ReportMetric(rate[w], modes[w]+"-msg/s")
		}
		b.ReportMetric(rate[0]/max(rate[1], 1e-9), "partition/inline")
	})
}
