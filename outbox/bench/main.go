// Command bench measures idem's outbox against watermill-sql's publisher and watermill's
// forwarder, in one harness and one run, on this machine: Postgres from internal/pgtemp (as the
// tests find it), NATS JetStream in this process (natstest), both shared by the variants, which
// take turns.
//
//	go run ./outbox/bench                        # every scenario, three rounds
//	go run ./outbox/bench -scenario throughput -rounds 3 -step 20s
//
// Scenarios (the "Numbers"):
//
//   - throughput: 8 writers over 10,000 keys, 1 KiB payloads, one business UPDATE per
//     transaction, 1 or 100 messages per transaction; the offered rate steps up until the
//     backlog grows; the highest rate kept up with is the sustained throughput, and the COMMIT
//     to PubAck latency is read at the 3,000 msg/s step.
//   - idle: 3,000 msg/s while a session that wrote something sits idle in transaction for 30s.
//   - relays: one relay against two at a rate one cannot keep up with, and how long lanes take
//     to move when a relay joins and when one is SIGKILLed.
//   - append: the transfer transaction alone, with an Append, and with watermill's publisher.
//   - kill: 3,000 msg/s while the relay (a child process) is SIGKILLed every few seconds.
//
// It is a module of its own, so that watermill stays out of idem's go.mod; CI vets it and does
// not run it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

type options struct {
	scenarios []string
	rounds    int
	step      time.Duration
	idleHold  time.Duration
	killEvery time.Duration
	killLease time.Duration
	perTx     int    // throughput: only this many messages per transaction (0: 1 and 100)
	only      string // throughput: only the variants whose name contains this
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child-relay" {
		os.Exit(childRelay(os.Args[2:]))
	}
	var o options
	var scen string
	flag.StringVar(&scen, "scenario", "throughput,idle,relays,append,kill", "comma-separated scenarios to run")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds, the variants interleaved in each")
	flag.DurationVar(&o.step, "step", 10*time.Second, "length of each offered-rate step")
	flag.DurationVar(&o.idleHold, "idle-hold", 30*time.Second, "how long the idle session holds its transaction")
	flag.DurationVar(&o.killEvery, "kill-every", 3*time.Second, "how often the kill scenario SIGKILLs the relay")
	flag.DurationVar(&o.killLease, "kill-lease", 0, "RelayOpts.Lease of the relay the kill scenario SIGKILLs (default the default lease)")
	flag.IntVar(&o.perTx, "per-tx", 0, "throughput: only this many messages per transaction (default both 1 and 100)")
	flag.StringVar(&o.only, "only", "", "throughput: only the variants whose name contains this")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	o.scenarios = strings.Split(scen, ",")
	ctx := context.Background()
	e, err := newEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	defer e.close()
	fmt.Printf("# outbox bench, %s, Postgres from %s, NATS in process\n\n", time.Now().UTC().Format(time.RFC3339), e.pg.Source())
	for _, s := range []struct {
		name string
		run  func(context.Context, *env, options) error
	}{{"throughput", throughput}, {"idle", idleScenario}, {"relays", relaysScenario}, {"append", appendScenario}, {"kill", killScenario}} {
		if !slices.Contains(o.scenarios, s.name) {
			continue
		}
		if err := s.run(ctx, e, o); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", s.name, err)
			return
		}
	}
}
