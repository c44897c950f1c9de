package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/natspub"
	"github.com/idemkit/idem/tx"
)

var allVariants = []variant{idemVariant{}, watermillVariant{}, watermillVariant{tuned: true}}

// stepResult is one offered rate held for a step.
type stepResult struct {
	offered, written, delivered float64
	backlog                     int64
	p50, p99                    time.Duration
	kept                        bool
}

// sweep raises the offered rate step by step until the backlog grows.
func sweep(ctx context.Context, r *run, perTx int, rates []float64, step time.Duration) ([]stepResult, error) {
	rctx, rcancel := context.WithCancel(ctx)
	stop, err := r.v.start(rctx, r.pool, r.e.js, r.ack)
	if err != nil {
		rcancel()
		return nil, err
	}
	defer func() { rcancel(); stop() }()
	var out []stepResult
	for _, rate := range rates {
		wctx, cancel := context.WithTimeout(ctx, step)
		a0, w0, t0 := r.acked.Load(), r.appended.Load(), time.Now()
		err := r.write(wctx, rate, perTx)
		cancel()
		if err != nil {
			return out, err
		}
		el := time.Since(t0).Seconds()
		res := stepResult{offered: rate, written: float64(r.appended.Load()-w0) / el, delivered: float64(r.acked.Load()-a0) / el,
			backlog: r.appended.Load() - r.acked.Load()}
		res.p50, res.p99, _, _ = r.percentiles(t0.Add(step/5), t0.Add(step))
		// Kept up: the backlog is under a second of the rate, and the writers got near the rate.
		res.kept = float64(res.backlog) < rate && res.written >= 0.9*rate
		out = append(out, res)
		if !res.kept {
			break
		}
	}
	return out, nil
}

func throughput(ctx context.Context, e *env, o options) error {
	fmt.Printf("## throughput (8 writers, 10,000 keys, 1 KiB, one UPDATE per transaction; %s steps)\n\n", o.step)
	fmt.Println("| round | msgs/tx | variant | sustained msg/s | steps (offered: delivered, backlog, p50/p99) | p50 / p99 ms at 3,000 msg/s |")
	fmt.Println("|---|---|---|---|---|---|")
	plans := []struct {
		perTx int
		rates []float64
	}{
		{1, []float64{1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000}},
		{100, []float64{2000, 4000, 6000, 8000, 10000, 12000, 15000, 18000}},
	}
	for round := 1; round <= o.rounds; round++ {
		for _, plan := range plans {
			if o.perTx != 0 && plan.perTx != o.perTx {
				continue
			}
			for _, v := range allVariants {
				if o.only != "" && !strings.Contains(v.name(), o.only) {
					continue
				}
				r, err := newRun(ctx, e, v)
				if err != nil {
					return err
				}
				steps, err := sweep(ctx, r, plan.perTx, plan.rates, o.step)
				r.close(ctx)
				if err != nil {
					return err
				}
				sustained, at3k, desc := 0.0, "-", ""
				for _, s := range steps {
					if s.kept {
						sustained = s.written
					}
					if s.offered == 3000 && plan.perTx == 1 {
						at3k = ms(s.p50) + " / " + ms(s.p99)
					}
					desc += fmt.Sprintf("%.0f: %.0f, %d, %s/%s ms; ", s.offered, s.delivered, s.backlog, ms(s.p50), ms(s.p99))
				}
				fmt.Printf("| %d | %d | %s | %.0f | %s | %s |\n", round, plan.perTx, v.name(), sustained, desc, at3k)
			}
		}
	}
	fmt.Println()
	return nil
}

// idleScenario offers 3,000 msg/s while a session that wrote something sits idle in transaction.
func idleScenario(ctx context.Context, e *env, o options) error {
	fmt.Printf("## idle in transaction (3,000 msg/s, 1 msg/tx; a session holds a transaction that wrote, for %s)\n\n", o.idleHold)
	fmt.Println("| round | variant | before: delivered msg/s, p50 / p99 ms | while held: delivered msg/s, p50 / p99 ms | backlog at the end of the hold |")
	fmt.Println("|---|---|---|---|---|")
	warm := 10 * time.Second
	for round := 1; round <= o.rounds; round++ {
		for _, v := range []variant{idemVariant{}, watermillVariant{tuned: true}, watermillVariant{}} {
			r, err := newRun(ctx, e, v)
			if err != nil {
				return err
			}
			rctx, rcancel := context.WithCancel(ctx)
			defer rcancel()
			stop, err := v.start(rctx, r.pool, e.js, r.ack)
			if err != nil {
				return err
			}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			werr := make(chan error, 1)
			go func() { werr <- r.write(wctx, 3000, 1) }()
			time.Sleep(warm)
			a0, t0 := r.acked.Load(), time.Now()
			idle, err := r.pool.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := idle.Exec(ctx, `UPDATE accounts SET n = n + 1 WHERE id = 0`); err != nil {
				return err
			}
			if _, err := idle.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
				return err
			}
			time.Sleep(o.idleHold)
			held := time.Since(t0).Seconds()
			aHeld := r.acked.Load()
			backlog := r.appended.Load() - r.acked.Load()
			_ = idle.Rollback(ctx)
			cancel()
			<-werr
			r.drain(time.Minute)
			rcancel()
			stop()
			b50, b99, _, _ := r.percentiles(t0.Add(-warm/2), t0)
			h50, h99, _, _ := r.percentiles(t0, t0.Add(o.idleHold))
			fmt.Printf("| %d | %s | %s / %s | %.0f, %s / %s | %d |\n", round, v.name(), ms(b50), ms(b99), float64(aHeld-a0)/held, ms(h50), ms(h99), backlog)
			r.close(ctx)
		}
	}
	fmt.Println()
	return nil
}

// relaysScenario compares one relay with two at a rate one relay may not keep up with, then
// times lanes moving when a relay joins and when one is SIGKILLed.
func relaysScenario(ctx context.Context, e *env, o options) error {
	fmt.Println("## relays (idem; 100 msgs/tx offered at 20,000 msg/s for one step)")
	fmt.Println()
	fmt.Println("| round | relays | written msg/s | delivered msg/s | backlog |")
	fmt.Println("|---|---|---|---|---|")
	for round := 1; round <= o.rounds; round++ {
		for _, n := range []int{1, 2} {
			r, err := newRun(ctx, e, idemVariant{relays: n})
			if err != nil {
				return err
			}
			steps, err := sweep(ctx, r, 100, []float64{20000}, o.step)
			r.close(ctx)
			if err != nil {
				return err
			}
			s := steps[0]
			fmt.Printf("| %d | %d | %.0f | %.0f | %d |\n", round, n, s.written, s.delivered, s.backlog)
		}
	}
	fmt.Println()
	fmt.Printf("| round | a relay joins: lanes split in | a relay is SIGKILLed: its lanes taken over in (lease %s) |\n", outbox.DefaultLease)
	fmt.Println("|---|---|---|")
	for round := 1; round <= o.rounds; round++ {
		join, death, err := laneMoves(ctx, e)
		if err != nil {
			return err
		}
		fmt.Printf("| %d | %s | %s |\n", round, join.Round(time.Millisecond), death.Round(time.Millisecond))
	}
	fmt.Println()
	return nil
}

// laneMoves starts a relay in this process, then one in a child process, and measures how long
// until they hold 8 lanes each; then SIGKILLs the child and measures how long until this
// process's relay holds all 16.
func laneMoves(ctx context.Context, e *env) (join, death time.Duration, err error) {
	r, err := newRun(ctx, e, idemVariant{})
	if err != nil {
		return 0, 0, err
	}
	defer r.close(ctx)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop, err := idemVariant{}.start(rctx, r.pool, e.js, r.ack)
	if err != nil {
		return 0, 0, err
	}
	defer func() { cancel(); stop() }()
	owned := func() map[string]int {
		lanes, err := outbox.Lanes(ctx, r.pool)
		n := map[string]int{}
		if err == nil {
			for _, l := range lanes {
				if l.Expires != nil && time.Until(*l.Expires) > 0 {
					n[l.Owner]++
				}
			}
		}
		return n
	}
	waitUntil := func(limit time.Duration, cond func(map[string]int) bool) error {
		deadline := time.Now().Add(limit)
		for !cond(owned()) {
			if time.Now().After(deadline) {
				return fmt.Errorf("lanes did not move within %s: %v", limit, owned())
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}
	if err := waitUntil(30*time.Second, func(o map[string]int) bool { return o["bench-0"] == 16 }); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	child, err := startChild(r.dbURL, e.nats.ClientURL(), "child", 0)
	if err != nil {
		return 0, 0, err
	}
	if err := waitUntil(30*time.Second, func(o map[string]int) bool { return o["bench-0"] == 8 && o["child"] == 8 }); err != nil {
		_ = child.Process.Kill()
		return 0, 0, err
	}
	join = time.Since(t0)
	t1 := time.Now()
	_ = child.Process.Signal(syscall.SIGKILL)
	_ = child.Wait()
	if err := waitUntil(60*time.Second, func(o map[string]int) bool { return o["bench-0"] == 16 }); err != nil {
		return 0, 0, err
	}
	return join, time.Since(t1), nil
}

// startChild runs this program as a relay process (see childRelay).
func startChild(dbURL, natsURL, name string, lease time.Duration) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "child-relay", "-db", dbURL, "-nats", natsURL, "-name", name, "-lease", lease.String())
	cmd.Stderr = os.Stderr
	return cmd, cmd.Start()
}

// childRelay is a relay with idem's defaults in a process of its own, to be SIGKILLed.
func childRelay(args []string) int {
	fs := flag.NewFlagSet("child-relay", flag.ExitOnError)
	dbURL := fs.String("db", "", "database URL")
	natsURL := fs.String("nats", "", "NATS URL")
	name := fs.String("name", "child", "relay name")
	lease := fs.Duration("lease", 0, "RelayOpts.Lease (0: the default)")
	_ = fs.Parse(args)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	nc, err := nats.Connect(*natsURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	js, _ := jetstream.New(nc)
	relay, err := outbox.NewRelay(pool, natspub.New(js, nil), &outbox.RelayOpts{Name: *name, Lease: *lease, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = relay.Run(ctx)
	return 0
}

// appendScenario is the transfer transaction (two UPDATEs and a ledger INSERT) alone, with an
// outbox.Append of a 1 KiB message, and with watermill's publisher (through the forwarder's
// envelope) in the same transaction, 8 clients as fast as they go, interleaved.
func appendScenario(ctx context.Context, e *env, o options) error {
	fmt.Printf("## append inside the transfer transaction (8 clients, closed loop, %s each, interleaved)\n\n", o.step/2)
	fmt.Println("| round | transfer alone tx/s | + outbox.Append tx/s (ratio) | + watermill publisher tx/s (ratio) | + Append, 16 B payload (ratio) | + Append, no key (ratio) |")
	fmt.Println("|---|---|---|---|---|---|")
	type appender func(ctx context.Context, t pgx.Tx, m benchMsg) error
	variants := []struct {
		name string
		fn   appender
	}{
		{"bare", nil},
		{"idem", func(ctx context.Context, t pgx.Tx, m benchMsg) error {
			return idemVariant{}.appendTx(ctx, t, []benchMsg{m})
		}},
		{"watermill", func(ctx context.Context, t pgx.Tx, m benchMsg) error {
			return watermillVariant{}.appendTx(ctx, t, []benchMsg{m})
		}},
		// Where the cost goes: a 16-byte payload, and no key (no sequence number, no key lock).
		{"idem-small", func(ctx context.Context, t pgx.Tx, m benchMsg) error {
			m.payload = m.payload[:16]
			return idemVariant{}.appendTx(ctx, t, []benchMsg{m})
		}},
		{"idem-nokey", func(ctx context.Context, t pgx.Tx, m benchMsg) error {
			m.key = ""
			return idemVariant{}.appendTx(ctx, t, []benchMsg{m})
		}},
	}
	r, err := newRun(ctx, e, watermillVariant{})
	if err != nil {
		return err
	}
	defer r.close(ctx)
	if _, err := r.pool.Exec(ctx, `CREATE TABLE ledger (id bigserial PRIMARY KEY, a int, b int, amount bigint)`); err != nil {
		return err
	}
	for round := 1; round <= o.rounds; round++ {
		rates := map[string]float64{}
		for _, v := range variants {
			var n atomic.Int64
			var firstErr atomic.Pointer[error]
			var wg sync.WaitGroup
			deadline := time.Now().Add(o.step / 2)
			for range benchWriters {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						a, b := 1+randN(benchKeys), 1+randN(benchKeys)
						err := tx.Run(ctx, r.pool, func(ctx context.Context, t pgx.Tx) error {
							batch := &pgx.Batch{}
							batch.Queue(`UPDATE accounts SET n = n - 1 WHERE id = $1`, a)
							batch.Queue(`UPDATE accounts SET n = n + 1 WHERE id = $1`, b)
							batch.Queue(`INSERT INTO ledger (a, b, amount) VALUES ($1, $2, 1)`, a, b)
							if err := t.SendBatch(ctx, batch).Close(); err != nil {
								return err
							}
							if v.fn == nil {
								return nil
							}
							return v.fn(ctx, t, benchMsg{id: newID(), key: "account:" + strconv.Itoa(a), payload: r.payload})
						})
						if err == nil {
							n.Add(1)
						} else if firstErr.CompareAndSwap(nil, &err) {
							fmt.Fprintf(os.Stderr, "bench: append %s: %v\n", v.name, err)
						}
					}
				})
			}
			wg.Wait()
			rates[v.name] = float64(n.Load()) / (o.step / 2).Seconds()
		}
		fmt.Printf("| %d | %.0f | %.0f (%.2f) | %.0f (%.2f) | %.0f (%.2f) | %.0f (%.2f) |\n", round, rates["bare"], rates["idem"], rates["idem"]/rates["bare"],
			rates["watermill"], rates["watermill"]/rates["bare"], rates["idem-small"], rates["idem-small"]/rates["bare"],
			rates["idem-nokey"], rates["idem-nokey"]/rates["bare"])
	}
	fmt.Println()
	return nil
}

// killScenario offers 3,000 msg/s while the relay, in a child process, is SIGKILLed every few
// seconds and started again at once; a consumer of the stream measures COMMIT to delivery.
func killScenario(ctx context.Context, e *env, o options) error {
	lease := o.killLease
	if lease == 0 {
		lease = outbox.DefaultLease
	}
	fmt.Printf("## relay SIGKILLed every %s, lease %s (3,000 msg/s, 1 msg/tx, 30s; latency COMMIT to the consumer)\n\n", o.killEvery, lease)
	fmt.Println("| round | kills | p50 / p99 / max ms | lost | stored twice in the stream |")
	fmt.Println("|---|---|---|---|---|")
	for round := 1; round <= o.rounds; round++ {
		r, err := newRun(ctx, e, idemVariant{})
		if err != nil {
			return err
		}
		stream, err := e.js.Stream(ctx, streamName)
		if err != nil {
			return err
		}
		cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return err
		}
		cc, err := cons.Consume(func(m jetstream.Msg) { r.ack(m.Headers().Get("Bench-Id")) })
		if err != nil {
			return err
		}
		child, err := startChild(r.dbURL, e.nats.ClientURL(), "killed", o.killLease)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		werr := make(chan error, 1)
		t0 := time.Now()
		go func() { werr <- r.write(wctx, 3000, 1) }()
		kills := 0
		for wctx.Err() == nil {
			time.Sleep(o.killEvery)
			_ = child.Process.Signal(syscall.SIGKILL)
			_ = child.Wait()
			kills++
			if child, err = startChild(r.dbURL, e.nats.ClientURL(), "killed", o.killLease); err != nil {
				cancel()
				return err
			}
		}
		cancel()
		<-werr
		drained := r.drain(2 * time.Minute)
		_ = child.Process.Signal(syscall.SIGKILL)
		_ = child.Wait()
		cc.Stop()
		p50, p99, worst, _ := r.percentiles(t0, time.Now())
		info, _ := stream.Info(ctx)
		lost := r.appended.Load() - r.acked.Load()
		if !drained {
			fmt.Fprintf(os.Stderr, "bench: kill round %d did not drain\n", round)
		}
		fmt.Printf("| %d | %d | %s / %s / %s | %d | %d |\n", round, kills, ms(p50), ms(p99), ms(worst), lost, int64(info.State.Msgs)-r.acked.Load())
		r.close(ctx)
	}
	fmt.Println()
	return nil
}

func randN(n int) int { return rand.IntN(n) }
