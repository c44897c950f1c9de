// Command bank is a small bank service built on idem: accounts, transfers (one transaction behind
// idemhttp.Middleware, with a River job as the outbox, and a transfer.completed event published
// to NATS JetStream through idem's outbox, which a ledger consumer takes through its inbox) and
// payouts (a workflow that reserves
// money, charges a payment provider, settles or releases, and notifies). The payment provider is
// a fake HTTP service started in the same process; it honours its own Idempotency-Key and keeps
// its charges in a Postgres table, so they survive the bank and can be counted. A payout sent with
// "confirm": true gets a pending charge, which the provider confirms later by a webhook that it
// delivers twice; the webhook handler signals the payout in its own transaction, deduplicated by
// the provider's event id, and a payout that hears nothing within its timeout cancels the charge
// and releases the hold.
//
// Without flags it plays a self-driving demo against a throwaway Postgres (or the one in
// DATABASE_URL) and a NATS server of its own (or the one in NATS_URL), narrates every request, checks what it claimed against the database, and exits
// non-zero if an invariant fails:
//
//	go run ./examples/bank
//
// With -serve it keeps serving and prints curl lines to try, and the cmd/idem lines that show
// what they stored:
//
//	go run ./examples/bank -serve -addr 127.0.0.1:8080
//
// The integration tests run it as a subprocess: -addr 127.0.0.1:0 picks a free port and the
// program prints "listening on http://…" once it answers; -lease and -scan shorten recovery;
// -die-at makes the process SIGKILL itself at a named point (see crashPoints).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtemp"
)

// options are the command line, parsed.
type options struct {
	serve    bool
	addr     string
	lease    time.Duration
	scan     time.Duration
	dieAt    string
	flaky    float64
	slow     time.Duration
	poolSize int
	verbose  bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bank", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.serve, "serve", false, "keep serving instead of playing the demo")
	fs.StringVar(&o.addr, "addr", "", "listen address (default 127.0.0.1:8080 with -serve, a free port for the demo)")
	fs.DurationVar(&o.lease, "lease", 0, "workflow lease: how long a dead process keeps its payouts (default 1s for the demo, 10s with -serve)")
	fs.DurationVar(&o.scan, "scan", 0, "how often the recovery scan looks for payouts whose process died (default 1s for the demo, 5s with -serve)")
	fs.StringVar(&o.dieAt, "die-at", "", "SIGKILL this process the first time it reaches this point: "+crashPointList())
	fs.Float64Var(&o.flaky, "provider-flaky", 0, "probability that the provider drops the connection after charging")
	fs.DurationVar(&o.slow, "provider-slow", 0, "how long the provider takes to answer a charge")
	fs.IntVar(&o.poolSize, "pool", 20, "Postgres connections of the bank")
	fs.BoolVar(&o.verbose, "v", false, "log what idem and River report (warnings and errors)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.dieAt != "" && !validCrashPoint(o.dieAt) {
		return nil, fmt.Errorf("-die-at must be one of %s (got %q)", crashPointList(), o.dieAt)
	}
	if o.flaky < 0 || o.flaky >= 1 {
		return nil, fmt.Errorf("-provider-flaky must be in [0, 1) (got %g)", o.flaky)
	}
	// The demo waits for a dead payout to be resumed, so it wants recovery to be quick; a
	// served bank is a better example with leases closer to production's.
	def := func(d *time.Duration, demo, serve time.Duration) {
		if *d == 0 {
			*d = demo
			if o.serve {
				*d = serve
			}
		}
	}
	def(&o.lease, time.Second, 10*time.Second)
	def(&o.scan, time.Second, 5*time.Second)
	if o.addr == "" {
		o.addr = "127.0.0.1:0"
		if o.serve {
			o.addr = "127.0.0.1:8080"
		}
	}
	return o, nil
}

func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bank:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bank:", err)
		os.Exit(1)
	}
}

// run starts Postgres if needed, the bank and its provider, then plays the demo or serves until
// ctx ends.
func run(ctx context.Context, opts *options, out io.Writer) error {
	dbURL := os.Getenv("DATABASE_URL")
	source := "DATABASE_URL"
	if dbURL == "" {
		fmt.Fprintln(out, "starting a throwaway Postgres (set DATABASE_URL to use yours)...")
		srv, err := pgtemp.Start(ctx)
		if err != nil {
			return err
		}
		defer srv.Close()
		if dbURL, err = srv.CreateDatabase(ctx); err != nil {
			return err
		}
		source = srv.Source()
	}
	pool, err := openPool(ctx, dbURL, opts.poolSize)
	if err != nil {
		return err
	}
	defer pool.Close()

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if opts.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	a, err := start(ctx, pool, opts, logger)
	if err != nil {
		return err
	}
	defer a.stop()
	fmt.Fprintf(out, "postgres from %s; payment provider at %s\n", source, a.provider.url)
	fmt.Fprintf(out, "transfer.completed events go to NATS JetStream (%s)\n", a.events.source)
	fmt.Fprintf(out, "listening on %s\n", a.url)

	if opts.serve {
		printCurls(out, a.url)
		fmt.Fprint(out, cliLines(dbURL, source == "DATABASE_URL"))
		<-ctx.Done()
		fmt.Fprintln(out, "shutting down")
		return nil
	}
	return demo(ctx, a, out)
}

// openPool connects with room for the HTTP handlers, River's workers and the provider at once:
// pgxpool's default (four on a small machine) would make them queue for connections.
func openPool(ctx context.Context, dbURL string, size int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("error parsing DATABASE_URL: %w", err)
	}
	if u, err := url.Parse(dbURL); err != nil || !u.Query().Has("pool_max_conns") {
		cfg.MaxConns = int32(size)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("error connecting to postgres: %w", err)
	}
	return pool, nil
}

func printCurls(out io.Writer, base string) {
	fmt.Fprint(out, curlLines(base))
}

// cliLines shows how to look at the bank's payouts with idem's CLI, from the repository's root.
// A DATABASE_URL the user set is not repeated: it may hold a password, and their shell has it.
func cliLines(dbURL string, fromEnv bool) string {
	env := "DATABASE_URL='" + dbURL + "' "
	if fromEnv {
		env = ""
	}
	return fmt.Sprintf(`then look at the payouts with idem's CLI (from the repository's root):

  %[1]sgo run ./cmd/idem runs list
  %[1]sgo run ./cmd/idem runs show customer:bob p-1
  %[1]sgo run ./cmd/idem keys get customer:alice t-1

`, env)
}

// curlLines is the tour printed by -serve: each POST may be sent again with the same
// Idempotency-Key, and runs once. TestCurlLines sends them.
func curlLines(base string) string {
	return fmt.Sprintf(`
try it (each POST may be sent again with the same Idempotency-Key: it runs once):

  curl -s -XPOST %[1]s/accounts -H 'X-Customer: alice' -H 'Content-Type: application/json' -d '{"opening":1000}'
  curl -s -XPOST %[1]s/accounts -H 'X-Customer: bob' -H 'Content-Type: application/json' -d '{"opening":1000}'
  curl -si -XPOST %[1]s/transfers -H 'X-Customer: alice' -H 'Idempotency-Key: t-1' \
       -H 'Content-Type: application/json' -d '{"from":1,"to":2,"amount":100}'
  # the same request, as equivalent JSON: replayed, not run again
  curl -si -XPOST %[1]s/transfers -H 'X-Customer: alice' -H 'Idempotency-Key: t-1' \
       -H 'Content-Type: application/json' -d '{ "amount": 100, "to": 2, "from": 1 }'
  # the same key for another amount: 422
  curl -si -XPOST %[1]s/transfers -H 'X-Customer: alice' -H 'Idempotency-Key: t-1' \
       -H 'Content-Type: application/json' -d '{"from":1,"to":2,"amount":999}'
  # bob cannot move alice's money: 404
  curl -si -XPOST %[1]s/transfers -H 'X-Customer: bob' -H 'Idempotency-Key: t-2' \
       -H 'Content-Type: application/json' -d '{"from":1,"to":2,"amount":100}'
  curl -si -XPOST %[1]s/payouts -H 'X-Customer: bob' -H 'Idempotency-Key: p-1' \
       -H 'Content-Type: application/json' -d '{"account":2,"amount":50}'
  curl -s %[1]s/accounts/1 -H 'X-Customer: alice'
  # then the payouts in a browser (idemui, read-only): %[1]s%[2]s/runs

`, base, opsPrefix)
}
