package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/natspub"
	"github.com/idemkit/idem/outbox/natspub/natstest"
)

// The bank tells other services about its transfers through NATS JetStream: the transfer's own
// transaction appends transfer.completed to idem's outbox, a relay publishes it, and a consumer
// (here a goroutine standing for another service, the ledger) takes it through an inbox, which
// runs its handler once per message and acknowledges JetStream only after its COMMIT.

const (
	topicTransferCompleted = "transfer.completed"
	streamName             = "BANK"
	ledgerConsumer         = "ledger"
)

// transferCompleted is the event's payload.
type transferCompleted struct {
	TransferID int64  `json:"transfer_id"`
	Scope      string `json:"scope"`
	Key        string `json:"key"`
	From       int64  `json:"from"`
	To         int64  `json:"to"`
	Amount     int64  `json:"amount"`
}

// appendTransferCompleted appends the event in t, the transfer's transaction. Its key is the
// paying account: one account's transfers are published in the order they committed.
func appendTransferCompleted(ctx context.Context, t pgx.Tx, ev transferCompleted) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = outbox.Append(ctx, t, outbox.Message{Topic: topicTransferCompleted, Key: fmt.Sprintf("account:%d", ev.From), Payload: body,
		Headers: map[string]string{"Content-Type": "application/json"}})
	return err
}

// events is the bank's side of NATS: the server it started (if any), the relay and the ledger's
// consumer.
type events struct {
	server *natstest.Server
	dir    string
	nc     *nats.Conn
	stream jetstream.Stream
	source string
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startEvents connects to NATS_URL, or starts a NATS server in this process when it is not set,
// makes the stream, and starts the relay and the ledger's consumer.
func startEvents(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (*events, error) {
	ev := &events{source: "NATS_URL"}
	url := os.Getenv("NATS_URL")
	if url == "" {
		dir, err := os.MkdirTemp("", "bank-nats-")
		if err != nil {
			return nil, err
		}
		srv, err := natstest.Start(dir)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		ev.server, ev.dir, ev.source, url = srv, dir, "an embedded NATS server", srv.ClientURL()
	}
	var err error
	ev.nc, err = nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		ev.close()
		return nil, fmt.Errorf("error connecting to NATS at %s: %w", url, err)
	}
	js, err := jetstream.New(ev.nc)
	if err != nil {
		ev.close()
		return nil, err
	}
	// The duplicate window is JetStream's deduplication on Nats-Msg-Id: a relay that dies
	// between the PubAck and its record publishes again, and the repeat is dropped.
	ev.stream, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{"transfer.>"},
		Storage: jetstream.FileStorage, Duplicates: 10 * time.Minute})
	if err != nil {
		ev.close()
		return nil, fmt.Errorf("error making the stream: %w", err)
	}
	relay, err := outbox.NewRelay(pool, natspub.New(js, nil), &outbox.RelayOpts{Logger: logger, Lease: 5 * time.Second})
	if err != nil {
		ev.close()
		return nil, err
	}
	cons, err := ev.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: ledgerConsumer, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 10 * time.Second})
	if err != nil {
		ev.close()
		return nil, err
	}
	inbox, err := outbox.NewInbox(pool, ledgerConsumer, nil)
	if err != nil {
		ev.close()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	ev.cancel = cancel
	ev.wg.Go(func() {
		if err := relay.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error("bank: the outbox relay stopped", "error", err)
		}
	})
	ev.wg.Go(func() { consumeLedger(runCtx, cons, inbox, logger) })
	return ev, nil
}

// consumeLedger is the ledger service: it records each completed transfer once, through the
// inbox, and acknowledges the message only once that is committed.
func consumeLedger(ctx context.Context, cons jetstream.Consumer, inbox *outbox.Inbox, logger *slog.Logger) {
	for ctx.Err() == nil {
		batch, err := cons.FetchNoWait(100)
		if err == nil {
			for msg := range batch.Messages() {
				handleLedger(ctx, msg, inbox, logger)
			}
			err = batch.Error()
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) {
			logger.Warn("bank: the ledger's consumer cannot fetch; retrying", "error", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func handleLedger(ctx context.Context, msg jetstream.Msg, inbox *outbox.Inbox, logger *slog.Logger) {
	var ev transferCompleted
	if err := json.Unmarshal(msg.Data(), &ev); err != nil {
		logger.Error("bank: the ledger got a message it cannot read; terminating it", "error", err)
		_ = msg.Term()
		return
	}
	_, err := inbox.Handle(ctx, msg.Headers().Get(jetstream.MsgIDHeader), func(ctx context.Context, t pgx.Tx) error {
		_, err := t.Exec(ctx, `INSERT INTO bank_ledger_events (message_id, transfer_id, scope, idem_key, amount) VALUES ($1, $2, $3, $4, $5)`,
			msg.Headers().Get(jetstream.MsgIDHeader), ev.TransferID, ev.Scope, ev.Key, ev.Amount)
		return err
	})
	if err != nil {
		_ = msg.NakWithDelay(time.Second) // not recorded: JetStream delivers it again
		return
	}
	_ = msg.Ack()
}

// streamCount is how many messages the stream holds.
func (ev *events) streamCount(ctx context.Context) (uint64, error) {
	info, err := ev.stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// close stops the relay and the consumer, then NATS.
func (ev *events) close() {
	if ev.cancel != nil {
		ev.cancel()
		ev.wg.Wait()
	}
	if ev.nc != nil {
		ev.nc.Close()
	}
	if ev.server != nil {
		ev.server.Shutdown()
		ev.server.WaitForShutdown()
	}
	if ev.dir != "" && strings.HasPrefix(ev.dir, os.TempDir()) {
		_ = os.RemoveAll(ev.dir)
	}
}
