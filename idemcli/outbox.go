package idemcli

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
)

// outboxFlags are the flags of idem outbox list.
type outboxFlags struct {
	status, topic, key string
	after              int64
	limit              int
}

func (c *call) outboxOpts() []outbox.Option { return []outbox.Option{outbox.Schema(c.schema)} }

// message reads the ID argument and connects.
func (c *call) message(ctx context.Context) (uuid.UUID, *pgxpool.Pool, error) {
	id, err := uuid.Parse(c.args[0])
	if err != nil {
		return uuid.UUID{}, nil, usagef("%q is not a message id (a UUID, as idem outbox list prints): %v", c.args[0], err)
	}
	pool, err := c.connect(ctx)
	return id, pool, err
}

var outboxListCmd = &command{
	name:    "outbox list",
	summary: "List outbox messages in position order; by default those that need an operator.",
	help: "Without --status it lists the stopped, dead-lettered and skipped messages; --status takes\n" +
		"pending, published, stopped, dead, skipped or all. When a page is full, the last line gives\n" +
		"the --after position of the next page.",
	flags: func(fs *flag.FlagSet, c *call) {
		fs.StringVar(&c.outbox.status, "status", "", "only messages in this status (pending, published, stopped, dead, skipped, all)")
		fs.StringVar(&c.outbox.topic, "topic", "", "only messages of this topic")
		fs.StringVar(&c.outbox.key, "key", "", "only messages of this key")
		fs.Int64Var(&c.outbox.after, "after", 0, "list after this position (from the previous page)")
		fs.IntVar(&c.outbox.limit, "limit", 100, "page size, at most 1000")
	},
	run: func(ctx context.Context, c *call) error {
		switch c.outbox.status {
		case "", "all", "pending", "published", "stopped", "dead", "skipped":
		default:
			return usagef("--status %q is not a status; use pending, published, stopped, dead, skipped or all", c.outbox.status)
		}
		if c.outbox.limit < 1 || c.outbox.limit > 1000 {
			return usagef("--limit must be between 1 and 1000 (got %d)", c.outbox.limit)
		}
		pool, err := c.connect(ctx)
		if err != nil {
			return err
		}
		page, err := outbox.List(ctx, pool, &outbox.ListParams{Status: outbox.Status(c.outbox.status), Topic: c.outbox.topic,
			Key: c.outbox.key, After: c.outbox.after, Limit: c.outbox.limit}, c.outboxOpts()...)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(page)
		}
		t := newTable(c.stdout)
		t.row("POS", "ID", "STATUS", "TOPIC", "KEY", "SEQ", "ATTEMPTS", "CREATED", "ERROR")
		for _, m := range page {
			t.row(strconv.FormatInt(m.Position, 10), m.ID.String(), string(m.Status), m.Topic, orDash(clip(m.Key, 40)), seqOf(m),
				strconv.Itoa(m.Attempts), stamp(m.Created), orDash(clip(m.LastError, 60)))
		}
		t.flush()
		if len(page) == c.outbox.limit {
			fmt.Fprintf(c.stdout, "more: --after %d\n", page[len(page)-1].Position)
		}
		return nil
	},
}

func seqOf(m *outbox.Info) string {
	if m.Key == "" {
		return "-"
	}
	return strconv.FormatInt(m.Seq, 10)
}

var outboxShowCmd = &command{
	name:    "outbox show",
	args:    []string{"ID"},
	summary: "Show an outbox message: where it stands, its attempts, headers and payload.",
	run: func(ctx context.Context, c *call) error {
		id, pool, err := c.message(ctx)
		if err != nil {
			return err
		}
		m, err := outbox.Get(ctx, pool, id, c.outboxOpts()...)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(m)
		}
		t := newTable(c.stdout)
		t.row("id", m.ID.String())
		t.row("status", string(m.Status))
		t.row("topic", m.Topic)
		t.row("key", orDash(m.Key))
		t.row("seq", seqOf(m))
		t.row("position", strconv.FormatInt(m.Position, 10))
		t.row("created", stamp(m.Created))
		t.row("published", stampPtr(m.Published))
		t.row("attempts", strconv.Itoa(m.Attempts))
		t.row("last error", orDash(m.LastError))
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			t.row("header "+k, m.Headers[k])
		}
		payload := fmt.Sprintf("%d bytes", len(m.Payload))
		if utf8.Valid(m.Payload) && len(m.Payload) > 0 {
			payload = clip(string(m.Payload), 200)
		}
		t.row("payload", payload)
		t.flush()
		return nil
	},
}

var outboxRetryCmd = &command{
	name:    "outbox retry",
	args:    []string{"ID"},
	summary: "Publish a stopped, dead-lettered or skipped message again, with fresh attempts.",
	help: "A stopped key goes on from it in order. A dead-lettered or skipped message is published\n" +
		"after the later messages of its key, which went out meanwhile. Fix what made it fail first.",
	run: func(ctx context.Context, c *call) error {
		return c.outboxFix(ctx, outbox.Retry, "will be published again")
	},
}

var outboxSkipCmd = &command{
	name:    "outbox skip",
	args:    []string{"ID"},
	summary: "Set a stopped or dead-lettered message aside for good; its key goes on.",
	run:     func(ctx context.Context, c *call) error { return c.outboxFix(ctx, outbox.Skip, "is skipped") },
}

// outboxFix runs retry or skip on the message named by the argument.
func (c *call) outboxFix(ctx context.Context, fix func(context.Context, idem.Beginner, uuid.UUID, ...outbox.Option) error, done string) error {
	id, pool, err := c.message(ctx)
	if err != nil {
		return err
	}
	if err := fix(ctx, pool, id, c.outboxOpts()...); err != nil {
		return err
	}
	return c.done(fmt.Sprintf("message %s %s", id, done), map[string]string{"id": id.String(), "result": done})
}
