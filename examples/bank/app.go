package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemkit/idem/idemriver"
	"github.com/idemkit/idem/workflow"
)

// schema is the bank's own tables. There is deliberately no unique index on a transfer's or a
// payout's idempotency key: idem is what must keep them unique, and the checks count rows per
// key to prove it, which a unique index would turn into errors that hide the count.
const schema = `
CREATE TABLE IF NOT EXISTS bank_accounts (
    id         bigserial PRIMARY KEY,
    owner      text NOT NULL,
    opening    bigint NOT NULL CHECK (opening >= 0),
    balance    bigint NOT NULL CHECK (balance >= 0),
    held       bigint NOT NULL DEFAULT 0 CHECK (held >= 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS bank_transfers (
    id           bigserial PRIMARY KEY,
    scope        text NOT NULL,
    idem_key     text NOT NULL,
    from_account bigint NOT NULL,
    to_account   bigint NOT NULL,
    amount       bigint NOT NULL,
    status       text NOT NULL CHECK (status IN ('done', 'declined')),
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS bank_payouts (
    id         bigserial PRIMARY KEY,
    scope      text NOT NULL,
    idem_key   text NOT NULL,
    account    bigint NOT NULL,
    amount     bigint NOT NULL,
    status     text NOT NULL CHECK (status IN ('reserved', 'settled', 'released', 'declined')),
    charge_id  text,
    reason     text,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- Webhooks from the provider, as received (a delivery repeated by the provider is one row).
CREATE TABLE IF NOT EXISTS bank_webhooks (
    event_id    text PRIMARY KEY,
    charge_id   text NOT NULL,
    ref         text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS bank_notifications (
    job_id       bigint PRIMARY KEY,
    event        text NOT NULL,
    ref          text NOT NULL,
    delivered_at timestamptz NOT NULL DEFAULT now()
);
-- The ledger service's record of completed transfers, written by its inbox from the
-- transfer.completed events the bank publishes through idem's outbox.
CREATE TABLE IF NOT EXISTS bank_ledger_events (
    message_id  text NOT NULL,
    transfer_id bigint NOT NULL,
    scope       text NOT NULL,
    idem_key    text NOT NULL,
    amount      bigint NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
-- The payment provider's own table: in real life another company's database.
CREATE TABLE IF NOT EXISTS provider_charges (
    idem_key   text PRIMARY KEY,
    status     text NOT NULL CHECK (status IN ('pending', 'charged', 'declined', 'canceled')),
    charge_id  text,
    account    bigint,
    amount     bigint,
    created_at timestamptz NOT NULL DEFAULT now()
);`

// app is the running bank: its database, workflow engine, River client, provider and server.
type app struct {
	pool     *pgxpool.Pool
	engine   *workflow.Engine
	river    *river.Client[pgx.Tx]
	payout   *workflow.Workflow[payoutInput, payoutReceipt]
	provider *provider
	events   *events
	crash    *crashPoints
	log      *slog.Logger
	url      string
	srv      *http.Server
	served   chan struct{}
}

// migrate applies idem's schema, River's and the bank's, retrying a few times: a process that
// starts while its killed predecessor's backends still hold locks can lose a deadlock to them
// (idem.Migrate's ALTER TABLE takes a strong lock even when there is nothing to change).
func migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	var err error
	for attempt := 1; attempt <= 8; attempt++ {
		if err = migrateOnce(ctx, pool, logger); err == nil {
			return nil
		}
		logger.Warn("bank: error migrating; retrying", "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * 250 * time.Millisecond):
		}
	}
	return err
}

func migrateOnce(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	// idem's tables and River's, under one lock, as every process that starts should.
	if err := idemriver.Migrate(ctx, pool, &idemriver.MigrateConfig{Logger: logger}); err != nil {
		return err
	}
	// Two bank processes starting at once (a restart while the old one dies) would race on
	// CREATE TABLE IF NOT EXISTS, which is not safe against itself.
	return pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error {
		if _, err := t.Exec(ctx, `SELECT pg_advisory_xact_lock(7333)`); err != nil {
			return err
		}
		_, err := t.Exec(ctx, schema)
		return err
	})
}

// start migrates, then starts the provider, the River client (idem's workers and periodic jobs
// next to the bank's notify worker: one client, as River wants) and the HTTP server.
func start(ctx context.Context, pool *pgxpool.Pool, opts *options, logger *slog.Logger) (*app, error) {
	if err := migrate(ctx, pool, logger); err != nil {
		return nil, err
	}
	a := &app{pool: pool, log: logger, crash: newCrashPoints(opts.dieAt), served: make(chan struct{})}

	var err error
	if a.provider, err = startProvider(pool, opts.flaky, opts.slow); err != nil {
		return nil, err
	}
	a.payout = a.definePayout()
	a.engine, err = workflow.NewEngine(pool, &workflow.Config{
		Workflows:    []workflow.Definition{a.payout},
		Lease:        opts.lease,
		ScanInterval: opts.scan,
		Logger:       logger,
	})
	if err != nil {
		a.provider.close()
		return nil, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &notifyWorker{pool: pool})
	if err := a.engine.AddWorkers(workers); err != nil {
		a.provider.close()
		return nil, err
	}
	a.river, err = river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}},
		Workers:      workers,
		PeriodicJobs: a.engine.PeriodicJobs(),
		// Quick pickup keeps the demo's recovery and notifications snappy.
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 200 * time.Millisecond,
		Logger:            logger,
	})
	if err != nil {
		a.provider.close()
		return nil, err
	}
	a.engine.SetClient(a.river)
	if err := a.river.Start(ctx); err != nil {
		a.provider.close()
		return nil, fmt.Errorf("error starting River: %w", err)
	}
	if a.events, err = startEvents(ctx, pool, logger); err != nil {
		a.stopRiver()
		a.provider.close()
		return nil, err
	}

	ln, err := net.Listen("tcp", opts.addr)
	if err != nil {
		a.events.close()
		a.stopRiver()
		a.provider.close()
		return nil, fmt.Errorf("error listening on %s: %w", opts.addr, err)
	}
	a.url = "http://" + ln.Addr().String()
	a.provider.setWebhook(a.url + "/webhooks/provider")
	handler, err := a.routes()
	if err != nil {
		_ = ln.Close()
		a.events.close()
		a.stopRiver()
		a.provider.close()
		return nil, err
	}
	a.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(a.served)
		if err := a.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("bank: server stopped", "error", err)
		}
	}()
	return a, nil
}

func (a *app) stopRiver() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = a.river.Stop(ctx)
	_ = a.engine.Close()
}

// stop shuts the server down first, so that no request starts work River would not finish,
// then River, the outbox's relay and consumer, and the provider.
func (a *app) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = a.srv.Shutdown(ctx)
	<-a.served
	a.stopRiver()
	a.events.close()
	a.provider.close()
}

// notifyArgs is the bank's own River job: tell the customer about a transfer or a payout. It is
// inserted in the transaction that does the work (the outbox), so it exists exactly when the
// work committed.
type notifyArgs struct {
	Event string `json:"event"`
	Ref   string `json:"ref"`
}

func (notifyArgs) Kind() string { return "bank_notify" }

type notifyWorker struct {
	river.WorkerDefaults[notifyArgs]
	pool *pgxpool.Pool
}

// Work "sends" the notification by recording it. River runs a job at least once, so the record
// is keyed by the job: a second run changes nothing.
func (w *notifyWorker) Work(ctx context.Context, job *river.Job[notifyArgs]) error {
	_, err := w.pool.Exec(ctx, `INSERT INTO bank_notifications (job_id, event, ref) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
		job.ID, job.Args.Event, job.Args.Ref)
	return err
}
